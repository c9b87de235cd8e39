"""The ``velvetrope`` command line: ``serve``, ``engine``, ``demo``, ``top``, ``simulate``,
``plan`` and the rest.

Each subcommand lives beside the code it drives; this module only wires them together.

Importing this module, or running one command, imports no other command's code: a
subcommand defined in another package is named in :data:`LAZY_COMMANDS` and imported the
first time it is looked up (run, shown by ``--help``, completed), and the commands defined
here import what they drive inside their bodies.  So ``velvetrope serve`` loads the gateway
and nothing of the simulator, the planner, the engine model, numpy, scipy or matplotlib
(:data:`SERVE_MUST_NOT_IMPORT`; ``tests/test_lean_serve.py`` checks it, ``bench/serve_rss.py``
measures the memory).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, ClassVar

import typer
import typer.core
import typer.main

from velvetrope.errors import MissingExtra
from velvetrope.extras import extra_for

if TYPE_CHECKING:
    from typer._click import Command, Context

__all__ = ["LAZY_COMMANDS", "SERVE_MUST_NOT_IMPORT", "LazyGroup", "app", "main"]

SERVE_MUST_NOT_IMPORT = (
    "velvetrope.sim",
    "velvetrope.planner",
    "velvetrope.engine",
    "velvetrope.demo",
    "numpy",
    "scipy",
    "matplotlib",
    "PIL",
    "pandas",
    "dask",
    "distributed",
    "rich",
    "redis",
)
"""Packages (each with all its submodules) that ``velvetrope serve`` does not import: the
gateway needs none of them (``rich`` is typer's, for its help and error screens only;
``redis`` only when ``state.url`` names Redis, which the check's config does not)."""

LAZY_COMMANDS: dict[str, str] = {
    "engine": "velvetrope.engine.serve.cli:engine_command",
    "simulate": "velvetrope.sim.cli:simulate_command",
    "plan": "velvetrope.planner.cli:plan_command",
    "calibrate": "velvetrope.engine.calibrate.cli:calibrate_command",
    "top": "velvetrope.top.cli:top_command",
    "usage": "velvetrope.gateway.ops.usage_cli:usage_command",
}
"""Subcommands defined elsewhere, by name: ``"module:function"`` of a typer command function
(its parameters declared with ``typer.Option``/``typer.Argument``), imported when first used."""


def _missing(command: str | None, exc: ModuleNotFoundError) -> MissingExtra:
    """The MissingExtra for ``command`` failing on ``exc``; re-raises ``exc`` when no extra
    brings the module (a broken install, not a choice)."""
    extra = extra_for(command, exc.name)
    if extra is None or exc.name is None:
        raise exc
    return MissingExtra(f"velvetrope {command or ''}".strip(), exc.name, extra)


def _unavailable(name: str, error: MissingExtra) -> Command:
    """The command ``name`` of an install without its extra: prints ``error``, exits 2."""
    one = typer.Typer(add_completion=False)

    @one.command(
        name,
        # a backslash keeps rich (typer's help screens) from reading [extra] as markup
        help=f"(not installed: pip install 'velvetrope\\[{error.extra}]')",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def unavailable() -> None:
        typer.echo(str(error), err=True)
        raise typer.Exit(2)

    return typer.main.get_command(one)


def load_command(name: str, spec: str) -> Command:
    """The click command ``name`` built by typer from the function that ``spec``
    (``"module:function"``) names; imports that module."""
    module, _, function = spec.partition(":")
    one = typer.Typer(add_completion=False)
    one.command(name)(getattr(importlib.import_module(module), function))
    return typer.main.get_command(one)


class LazyGroup(typer.core.TyperGroup):
    """A typer command group that also lists the commands of :attr:`lazy` (name →
    ``"module:function"``) and imports each only when it is looked up.

    Listed before the commands registered on the app, in :attr:`lazy`'s order.  A name that
    is no command at all loads every lazy command first, so that the error can suggest the
    closest of all the names.
    """

    lazy: ClassVar[dict[str, str]] = LAZY_COMMANDS

    def list_commands(self, ctx: Context) -> list[str]:
        """Every command's name; imports nothing."""
        eager = super().list_commands(ctx)
        return [*(n for n in self.lazy if n not in eager), *eager]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        """The command ``cmd_name``, imported and built on its first lookup; None if unknown.

        When its module needs a package of an extra that is not installed
        (``velvetrope.extras``), the command is one that says so and exits 2, whatever its
        arguments (``--help`` included); the group's help lists it with that extra."""
        if cmd_name not in self.commands and cmd_name in self.lazy:
            try:
                command = load_command(cmd_name, self.lazy[cmd_name])
            except ModuleNotFoundError as exc:
                command = _unavailable(cmd_name, _missing(cmd_name, exc))
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: Context) -> object:
        """Run the command; a missing optional package exits 2 naming the extra to install."""
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            error = _missing(ctx.invoked_subcommand, exc)
        except MissingExtra as exc:
            error = exc
        typer.echo(str(error), err=True)
        raise typer.Exit(2)

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        """As typer's; an unknown name first loads every lazy command (for the suggestion)."""
        if args and args[0] not in self.commands and args[0] not in self.lazy:
            for name in self.lazy:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


app = typer.Typer(
    name="velvetrope",
    help="Admission control for LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    cls=LazyGroup,
)


def _print_version(value: bool) -> None:
    if value:
        from velvetrope.build_info import version_line

        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the version and the commit it was built from, and exit.",
    ),
) -> None:
    """Admission control for LLM inference."""


@app.command("version")
def version() -> None:
    """Print the version and the commit it was built from."""
    from velvetrope.build_info import version_line

    typer.echo(version_line())


config_app = typer.Typer(
    help="Check configuration files, print their JSON Schema, hash API keys.",
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")


@config_app.command("check")
def config_check(
    path: str = typer.Argument(..., help="The gateway YAML file."),
    template: bool = typer.Option(
        False, help="The file is a template: accept it without upstreams or API keys."
    ),
) -> None:
    """Validate a gateway config; print what it defines, or the file, field and reason.

    A config that no request could pass through (no upstreams, no API keys: an empty file
    is valid YAML and every field has a default) is refused unless --template says it is
    a starting point; so is an upstream whose api_key_env is not set here or whose
    ca_bundle cannot be read.  Exits 2 when the file is refused.
    """
    from velvetrope.config import load_config
    from velvetrope.core import apply_preset
    from velvetrope.errors import ConfigError, PolicyError

    try:
        cfg = load_config(path)
        policy = apply_preset(cfg.policy)
        from velvetrope.clock import ManualClock
        from velvetrope.core import AdmissionController

        AdmissionController(policy, ManualClock())
        missing = []
        if not any(cfg.upstreams.values()):
            missing.append("no upstreams (nothing to send a request to)")
        if not cfg.api_keys:
            missing.append("no api_keys (every request gets 401)")
        if not template:
            from velvetrope.gateway.upstream.upstream_access import check_access

            check_access(cfg)
        if missing and not template:
            raise ConfigError(
                f"{path}: " + "; ".join(missing) + " (pass --template to check a template)"
            )
    except (ConfigError, PolicyError) as e:
        typer.echo(f"invalid: {e}", err=True)
        raise typer.Exit(2) from None
    tiers = ", ".join(t.name for t in policy.tiers)
    typer.echo(
        f"ok: {path}: preset={policy.preset or 'custom'} tiers=[{tiers}] "
        f"tenants={len(policy.tenants)} api_keys={len(cfg.api_keys)} "
        f"pools={[p.name for p in policy.pools]} "
        f"upstreams={sum(len(u) for u in cfg.upstreams.values())}"
    )
    from velvetrope.core.policy import bucket_report

    for line in bucket_report(policy):
        typer.echo(line)


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of the gateway config (gateway.yaml), for editors and CI.

    The same schema is docs/schema/gateway.schema.json in the repository; point an
    editor at it with a first line "# yaml-language-server: $schema=PATH".
    """
    from velvetrope.config import gateway_json_schema

    typer.echo(gateway_json_schema())


@config_app.command("hash-key")
def config_hash_key(key: str = typer.Argument(..., help="An API key.")) -> None:
    """Print the SHA-256 to store in api_keys[].sha256."""
    from velvetrope.config import hash_key

    typer.echo(hash_key(key))


EXAMPLE_FILES = ("gateway.yaml", "scaledobject.yaml")
"""What ``velvetrope init`` copies: the example gateway config and the KEDA ScaledObject,
shipped in the wheel (``velvetrope/data/examples/``; in a checkout, ``examples/gateway.yaml``
and ``deploy/keda/scaledobject.yaml`` are links to them).  Beside them it writes the config's
JSON Schema, :data:`SCHEMA_FILE`."""

SCHEMA_FILE = "gateway.schema.json"
EXAMPLE_SCHEMA_LINE = "# yaml-language-server: $schema=../docs/schema/gateway.schema.json"
"""The example config's first line in the checkout; ``init`` points the copy's at the
schema it writes beside it."""


def init_text(name: str, text: str, written_as: str) -> str:
    """The copy of example file ``name`` that ``init`` writes to ``written_as``: the
    gateway config's header names that path (not the checkout's ``examples/gateway.yaml``)
    and its schema modeline the schema file written beside it."""
    if name != "gateway.yaml":
        return text
    text = text.replace(EXAMPLE_SCHEMA_LINE, f"# yaml-language-server: $schema={SCHEMA_FILE}")
    return text.replace("examples/gateway.yaml", written_as)


@app.command("init")
def init(
    directory: str = typer.Argument(".", help="Where to write the files (created if absent)."),
    force: bool = typer.Option(False, help="Overwrite files that exist."),
) -> None:
    """Write the example gateway config (gateway.yaml), its JSON Schema for editors
    (gateway.schema.json) and the KEDA ScaledObject (scaledobject.yaml) to DIRECTORY, to
    edit and deploy.

    Refuses (exit 2) to overwrite an existing file unless --force.
    """
    from importlib.resources import files
    from pathlib import Path

    from velvetrope.config import gateway_json_schema

    out = Path(directory)
    targets = [out / name for name in (*EXAMPLE_FILES, SCHEMA_FILE)]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        typer.echo(f"velvetrope init: {', '.join(existing)} exist (--force overwrites)", err=True)
        raise typer.Exit(2)
    out.mkdir(parents=True, exist_ok=True)
    source = files("velvetrope.data").joinpath("examples")
    for name, target in zip(EXAMPLE_FILES, targets, strict=False):
        target.write_text(init_text(name, source.joinpath(name).read_text(), str(target)))
        typer.echo(f"wrote {target}")
    targets[-1].write_text(gateway_json_schema() + "\n")
    typer.echo(f"wrote {targets[-1]}")
    typer.echo(
        f"next: point upstreams at your engines and list your api_keys in {targets[0]}, "
        f"then: velvetrope config check {targets[0]}"
    )


@app.command("serve")
def serve(
    config: str = typer.Option(..., "--config", "-c", help="The gateway YAML file."),
    host: str | None = typer.Option(None, help="Override listen.host."),
    port: int | None = typer.Option(None, help="Override listen.port."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
    workers: int = typer.Option(
        1, "--workers", "-w", help="Gateway processes on one port (needs a Redis state.url)."
    ),
) -> None:
    """Run the admission gateway in front of the configured upstreams."""
    from velvetrope.config import ConfigSource
    from velvetrope.errors import ConfigError
    from velvetrope.gateway.api.server import serve as run

    source = ConfigSource(config, host, port)
    try:
        cfg = source.load()
    except ConfigError as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        run(cfg, log_level=log_level, workers=workers, source=source)
    except ConfigError as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None


@app.command("demo")
def demo(
    window: float = typer.Option(20.0, help="Seconds of offered load per run."),
    drain: float = typer.Option(12.0, help="Seconds each run waits for open requests after."),
    speed: float = typer.Option(3.0, help="Engine speed: K times faster than real time."),
    profile: str = typer.Option("llama3-8b-a100", help="Engine profile of both engines."),
    overload: float = typer.Option(2.0, help="Offered load over the engines' capacity."),
    config: str | None = typer.Option(
        None, "--config", "-c", help="Gateway config (default: examples/gateway.yaml)."
    ),
    preset: str | None = typer.Option(None, help="Replace the config's queue preset."),
    out: str = typer.Option("out", help="Directory of the plot (demo.png)."),
    seed: int = typer.Option(7, help="Seed of the tenant assignment."),
    quick: bool = typer.Option(False, help="A few seconds per run, no live view."),
) -> None:
    """Overload two engines with a real trace, through the gateway and without: table + plot.

    Replays the Azure conversation trace compressed to OVERLOAD x the engines' capacity,
    first through `velvetrope serve` with the example config, then straight to the engines.
    """
    from pathlib import Path

    from velvetrope.demo import DEFAULT_CONFIG, DemoSettings, run_demo
    from velvetrope.errors import VelvetropeError

    try:
        settings = DemoSettings(
            window_s=window,
            drain_s=drain,
            speed=speed,
            profile=profile,
            overload=overload,
            config_path=Path(config) if config else DEFAULT_CONFIG,
            preset=preset,
            out_dir=Path(out),
            seed=seed,
        )
        if quick:
            settings = settings.as_quick()
        run_demo(settings)
    except (VelvetropeError, RuntimeError) as e:
        typer.echo(f"velvetrope demo: error: {e}", err=True)
        raise typer.Exit(2) from None


@app.command("scenario")
def scenario(seed: int = typer.Option(7, help="Random seed of the arrivals.")) -> None:
    """Print a scripted scenario through the admission core, decision by decision."""
    from velvetrope.sim.scenario import run_scenario

    run_scenario(seed=seed)


def main() -> None:
    """Entry point of the ``velvetrope`` console script."""
    app()
