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


def test_simulate_with_synthetic_arrivals_and_a_spike(tmp_path: Path) -> None:
    from velvetrope.sim.inputs import prepare_workload
    from velvetrope.sim.traffic import DayCycle, Spike

    result = runner.invoke(
        app,
        [
            "simulate",
            "--limit", "500",
            "--replicas", "1",
            "--arrivals", "day:0.5:3:0",
            "--spike", "300:60:4",
            "--duration", "600",
            "--seed", "3",
            "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    process = DayCycle(0.5, 3.0, 0.0, spikes=(Spike(300.0, 60.0, 4.0),))
    expected = prepare_workload("azure_conv", seed=3, limit=500, arrivals=process, duration=600.0)
    text = (tmp_path / "report.md").read_text()
    assert (
        f"azure_conv's request mix at day:0.5:3:0 arrivals over 600 s, spike 300:60:4 "
        f"({len(expected):,} requests)" in text
    )
    bad = runner.invoke(app, ["simulate", "--arrivals", "poisson:2", "--load", "0.5"])
    assert bad.exit_code == 2 and "--load" in bad.output
    bad = runner.invoke(app, ["simulate", "--arrivals", "poisson:2", "--spike", "1:2:3"])
    assert bad.exit_code == 2 and "spikes" in bad.output


def test_simulate_autoscale_from_the_deploy_file(tmp_path: Path) -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy" / "keda" / "scaledobject.yaml"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--limit", "300",
            "--replicas", "1",
            "--arrivals", "poisson:40",
            "--duration", "240",
            "--autoscale", str(deploy),
            "--startup", "60",
            "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "GPU-hours:" in result.output and "scale events:" in result.output
    text = (tmp_path / "report.md").read_text()
    assert "## Autoscaling" in text and "start-up 60 s" in text
    assert "threshold 16 AverageValue, replicas 2..8" in text
    assert (tmp_path / "replicas.png").stat().st_size > 10_000
    # 40 req/s is more than 2 replicas serve: KEDA asks for more
    up = [line for line in text.splitlines() if "→" in line and "hpa" in line]
    assert up, text
    bad = runner.invoke(app, ["simulate", "--limit", "50", "--autoscale", "config"])
    assert bad.exit_code == 2 and "autoscale section" in bad.output


def test_a_request_longer_than_the_context_is_explained_not_only_counted(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"t": 0.0, "tenant": "a", "prompt_tokens": 100, "output_tokens": 10}\n'
        '{"t": 0.5, "tenant": "a", "prompt_tokens": 9000, "output_tokens": 10}\n'
    )
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["simulate", "--trace", str(trace), "--replicas", "1", "--out", str(out)],
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "not completed: upstream_error 1" in text
    assert "longer than the model's context (the profile's max_model_len)" in text
    report = (out / "report.md").read_text()
    assert "`upstream_error`: the engine refused the request" in report


def test_a_run_without_refusals_says_nothing_of_them(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 0.0, "tenant": "a", "prompt_tokens": 100, "output_tokens": 10}\n')
    out = tmp_path / "out"
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "max_model_len" not in result.output
    assert "max_model_len" not in (out / "report.md").read_text()
