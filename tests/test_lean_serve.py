"""``velvetrope serve`` imports the gateway and nothing it does not need.

Each test runs a fresh interpreter (``sys.modules`` of this one holds whatever other tests
imported) and reads which modules it imported:

* the serve path: the real command line, ``velvetrope serve --config
  examples/gateway.yaml`` through :func:`velvetrope.cli.main` (typer's parsing, the config
  loaded and validated), with :func:`velvetrope.gateway.api.server.serve` replaced by one that
  builds the :class:`~velvetrope.gateway.api.app.Gateway` and prints ``sys.modules`` instead of
  listening: none of :data:`velvetrope.cli.SERVE_MUST_NOT_IMPORT` may be among them;
* the command group: listing every command's name imports none of their modules, and
  looking one up imports its own.

Deterministic: no server, no memory or time threshold (``bench/serve_rss.py`` measures the
memory of the real process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from velvetrope.cli import LAZY_COMMANDS, SERVE_MUST_NOT_IMPORT

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gateway.yaml"

SERVE_PATH = """
import json, sys
import velvetrope.gateway.api.server as server
from velvetrope.gateway.api.app import Gateway

def serve_and_report(config, **options):
    Gateway(config)  # what serve builds before it listens
    print(json.dumps(sorted(sys.modules)))

server.serve = serve_and_report
config = sys.argv[1]
sys.argv = ["velvetrope", "serve", "--config", config]
from velvetrope.cli import main
main()
"""
"""Runs ``velvetrope serve --config argv[1]`` up to listening; prints ``sys.modules``."""

LOOKUPS = """
import json, sys
import typer.main
from velvetrope.cli import app

group = typer.main.get_command(app)
ctx = group.make_context("velvetrope", ["version"])
names = group.list_commands(ctx)
listed = sorted(sys.modules)
group.get_command(ctx, sys.argv[1])
print(json.dumps({"names": names, "listed": listed, "looked_up": sorted(sys.modules)}))
"""
"""Lists the app's commands, then looks up the command ``argv[1]``; prints what each imported."""


def run(code: str, *args: str) -> object:
    """Run ``code`` in a fresh interpreter (in the repository's root); its stdout's JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def among(modules: list[str], packages: tuple[str, ...] | list[str]) -> list[str]:
    """The packages of ``packages`` that ``modules`` holds (the package or one inside it)."""
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in modules)]


def test_serve_imports_nothing_the_gateway_does_not_need() -> None:
    modules = run(SERVE_PATH, str(EXAMPLE))
    assert isinstance(modules, list)
    # the path ran: the command line, the config and the gateway were imported
    assert {"velvetrope.cli", "velvetrope.config", "velvetrope.gateway.api.app"} <= set(modules)
    assert among(modules, SERVE_MUST_NOT_IMPORT) == []


def test_the_check_sees_a_forbidden_import() -> None:
    # what the test above reads would show a simulator module, were one imported
    modules = run(
        SERVE_PATH.replace("import json, sys", "import json, sys, velvetrope.sim"), str(EXAMPLE)
    )
    assert isinstance(modules, list)
    assert "velvetrope.sim" in among(modules, SERVE_MUST_NOT_IMPORT)


def test_commands_are_listed_without_importing_them_and_imported_when_looked_up() -> None:
    seen = run(LOOKUPS, "plan")
    assert isinstance(seen, dict)
    assert set(LAZY_COMMANDS) | {"serve", "config", "version"} <= set(seen["names"])
    assert among(seen["listed"], SERVE_MUST_NOT_IMPORT) == []
    assert "velvetrope.planner.cli" in seen["looked_up"]
    assert among(seen["looked_up"], ["velvetrope.sim"]) == []  # plan's own module only
