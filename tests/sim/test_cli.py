"""``velvetrope simulate`` through typer's CliRunner on small trace windows."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from velvetrope.cli import app

runner = CliRunner()


def test_simulate_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--trace", "azure_conv",
            "--limit", "300",
            "--replicas", "2",
            "--load", "0.9",
            "--tenants", "gold:interactive:0.5,bronze:batch:0.5",
            "--slo", "batch=ttft:20",
            "--timeout", "30",
            "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "interactive" in result.output and "wall:" in result.output
    text = (out / "report.md").read_text()
    assert "| batch | TTFT ≤ 20 s |" in text
    assert (out / "ttft_cdf.png").exists()


def test_simulate_with_the_gateway_config_and_a_sweep(tmp_path: Path) -> None:
    config = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--config", str(config),
            "--window", "0:60",
            "--tenants", "acme:0.3,globex:0.3,initech:0.4",
            "--sweep", "policy=fifo,hybrid",
            "--sweep", "load=1.2",
            "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = (tmp_path / "sweep.md").read_text()
    assert "| fifo | 1.2 |" in text and "| hybrid | 1.2 |" in text


def test_simulate_reports_bad_input_as_an_error() -> None:
    result = runner.invoke(app, ["simulate", "--limit", "10", "--lengths", "psychic"])
    assert result.exit_code == 2
    assert "length knowledge" in result.output
