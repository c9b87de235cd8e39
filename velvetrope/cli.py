"""The ``velvetrope`` command line: ``serve``, ``engine``, ``demo``, ``simulate``, ``plan``.

Each subcommand lives beside the code it drives; this module only wires them together.
"""

from __future__ import annotations

import typer

__all__ = ["app", "main"]

app = typer.Typer(
    name="velvetrope",
    help="Admission control for LLM inference.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Admission control for LLM inference."""


@app.command("version")
def version() -> None:
    """Print the version."""
    from velvetrope import __version__

    typer.echo(__version__)


@app.command("demo")
def demo() -> None:
    """Run the end-to-end demo (currently: the scripted scenario through the core)."""
    from velvetrope.scenario import run_scenario

    run_scenario()


@app.command("scenario")
def scenario(seed: int = typer.Option(7, help="Random seed of the arrivals.")) -> None:
    """Print a scripted scenario through the admission core, decision by decision."""
    from velvetrope.scenario import run_scenario

    run_scenario(seed=seed)


def main() -> None:
    """Entry point of the ``velvetrope`` console script."""
    app()
