"""``velvetrope simulate --engine-scheduling``: the engine model's waiting queue in vLLM's
priority mode, fed the tier by a pool with ``engine_priority`` (typer's CliRunner, the
example config with the gateway's limits opened so that the engines hold the backlog)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from velvetrope.cli import app

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


def _config(tmp: Path) -> Path:
    """The example config whose pool lets everything through to the engines (no slot limit
    that binds, no saturation rule, no shedding) and forwards the tier as the priority."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    pol = doc["policy"]
    pol["pools"] = [{"name": "default", "max_in_flight": 100_000, "engine_priority": True}]
    pol["saturation"] = {"enabled": False}
    for tier in pol["tiers"]:
        tier.pop("max_wait_s", None)
        tier.pop("max_queued", None)
        tier.pop("degrade", None)
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _interactive_ttft_p99(report: Path) -> float:
    """The interactive row's TTFT p99 from the report's tier table (p50 / p90 / p99)."""
    for line in report.read_text().splitlines():
        if line.startswith("| interactive |"):
            return float(line.split("|")[6].split("/")[2])
    raise AssertionError(f"no interactive row in {report}")


def test_priority_engines_serve_the_forwarded_top_tier_first(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    p99 = {}
    for mode in ("fcfs", "priority"):
        out = tmp_path / mode
        result = runner.invoke(
            app,
            [
                "simulate", "--config", str(cfg), "--limit", "1500", "--replicas", "1",
                "--load", "1.6", "--tenants", "acme:0.2,globex:0.3,initech:0.5",
                "--engine-scheduling", mode, "--out", str(out),
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        named = "engines scheduling by priority" in (out / "report.md").read_text()
        assert named == (mode == "priority")
        p99[mode] = _interactive_ttft_p99(out / "report.md")
    # the engines' own queue holds the backlog: FCFS makes the top tier wait in it,
    # priority mode serves it first
    assert p99["priority"] < 0.5 * p99["fcfs"], p99


def test_an_unknown_engine_scheduling_is_an_error() -> None:
    result = runner.invoke(app, ["simulate", "--limit", "10", "--engine-scheduling", "lifo"])
    assert result.exit_code == 2
    assert "engine scheduling 'lifo'" in result.output
