"""``velvetrope plan`` through typer's CliRunner: text, JSON, plot, verify and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.engine import load_profile, profile_to_yaml
from velvetrope.errors import PolicyError
from velvetrope.planner.plan_inputs import parse_duration

runner = CliRunner()

WORKLOAD = """\
prompt_tokens: {p50: 600, p99: 3000}
output_tokens: {p50: 100, p99: 500}
arrival_rate_p99_1m: 30
tenants:
  - {name: a, share: 2}
  - {name: b, share: 1}
"""


@pytest.fixture
def wfile(tmp_path: Path) -> Path:
    f = tmp_path / "workload.yaml"
    f.write_text(WORKLOAD)
    return f


def plan_args(workload: Path) -> list[str]:
    """``plan --workload FILE`` with the fast analytic service model."""
    return ["plan", "--workload", str(workload), "--service-model", "analytic"]


def test_parse_duration() -> None:
    assert parse_duration("4s") == 4.0
    assert parse_duration("800ms") == pytest.approx(0.8)
    assert parse_duration("1.5m") == 90.0
    assert parse_duration("2h") == 7200.0
    assert parse_duration(" 2.5 ") == 2.5
    for bad in ("", "4 sec", "-1s", "0", "s"):
        with pytest.raises(PolicyError):
            parse_duration(bad)


def test_the_issue_example_as_json() -> None:
    cmd = "plan --profile llama3-70b-4xh100 --trace azure_conv --peak-rps 50 --slo-p99 4s"
    res = runner.invoke(app, [*cmd.split(), "--tier", "interactive", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["inputs"]["design_rps"] == 50.0
    assert doc["inputs"]["slo"] == {"metric": "wait", "p99_s": 4.0}
    assert doc["service"]["method"] == "closed-loop"
    p = doc["plan"]
    assert p["gpus"] == 4 * p["replicas"]  # 4×H100 per replica
    assert p["rho"] <= 0.6
    # ρ ≤ 0.6 at the per-replica rate the plan quotes, and one replica fewer would exceed it
    assert 50 / (p["replicas"] * p["per_replica_rps"]) == pytest.approx(p["rho"])
    assert 50 / ((p["replicas"] - 1) * p["per_replica_rps"]) > 0.6
    assert doc["latency"]["at"]["wait_p99_s"] <= 4.0


def test_text_output_explains_every_number(wfile: Path) -> None:
    opts = "--slo-metric e2e --slo-p99 12s --tier batch"
    res = runner.invoke(app, [*plan_args(wfile), *opts.split()])
    assert res.exit_code == 0, res.output
    out = res.stdout
    for needle in (
        "design rate       30 req/s — arrival_rate_p99_1m in",
        "replicas          ",
        "GPUs              ",
        "concurrency       ",
        "utilisation ρ     ",
        "effective μ       ",
        "queue wait        p50",
        "end-to-end        p50",
        "queue bound       ",
        "bucket 'a' (share 0.67)",
        "bucket 'b' (share 0.33)",
        "rule of thumb   refill",
        "model           refill",
        "KEDA threshold    ",
        "rule of thumb   ",
        "the common rule (L/S) × concurrency × 1.5 = (12 s / ",
        "queued per replica — the common rule scales at 8 on",
        "8 on vllm:num_requests_waiting",
    ):
        assert needle in out, needle
    assert "seed" not in out  # the rules of thumb are named for what they are
    lines = [ln for ln in out.splitlines() if ln.startswith("  ") and "—" in ln]
    assert len(lines) >= 10  # a value and its reason on every line


def test_trace_plan_says_the_wait_replays_the_arrivals() -> None:
    cmd = "plan --trace azure_code --service-model analytic --slo-p99 4s"
    res = runner.invoke(app, cmd.split())
    assert res.exit_code == 0, res.output
    assert "over the whole trace" in res.stdout
    assert "the queue wait replays the arrivals at the design rate" in res.stdout
    assert "warning: arrivals come in bursts" in res.stdout
    doc = json.loads(runner.invoke(app, [*cmd.split(), "--json"]).stdout)
    assert doc["inputs"]["wait_model"] == "gdc-replay"
    assert doc["inputs"]["arrival_scv_whole_trace"] > doc["inputs"]["arrival_scv"] > 10


def test_plot_and_json(wfile: Path, tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    res = runner.invoke(app, [*plan_args(wfile), "--json", "--plot", str(png), "--peak-rps", "12"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["plot"] == str(png)
    assert doc["inputs"]["design_rps"] == 12.0
    assert "--peak-rps" in doc["inputs"]["design_rate_origin"]
    assert [b["tenant"] for b in doc["buckets"]] == ["a", "b"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_verify_runs_the_simulator(wfile: Path, tmp_path: Path) -> None:
    small = load_profile("llama3-8b-h100").with_overrides(name="small", max_num_seqs=32)
    prof = tmp_path / "small.yaml"
    prof.write_text(profile_to_yaml(small))
    opts = "--verify --verify-requests 1500 --slo-metric e2e --slo-p99 20s"
    args = [*plan_args(wfile), "--profile", str(prof), *opts.split()]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["verify"]
    n = json.loads(res.stdout)["plan"]["replicas"]
    assert n >= 2 and [r["replicas"] for r in rows] == [n, n - 1]
    top = rows[0]
    assert top["completed_fraction"] == 1.0
    pred, sim = top["e2e_p99_s"]["predicted"], top["e2e_p99_s"]["simulated"]
    assert sim > 0 and abs(pred - sim) / sim < 0.3
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "verify: simulated 1,500 requests" in text.stdout
    assert "predicted p99" in text.stdout and "simulated p99" in text.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ("--service-model analytic", "exactly one of --trace and --workload"),
        ("--trace azure_conv --workload w.yaml", "exactly one of"),
        ("--trace azure_conv --slo-p99 soon", "bad duration"),
        ("--trace azure_conv --slo-metric tpot", "--slo-metric"),
        ("--trace azure_conv --tier gold", "no default for tier 'gold'"),
        ("--trace no/such.csv", "no/such.csv"),
        (
            "--trace azure_conv --service-model analytic --slo-metric e2e --slo-p99 1s",
            "cannot be met",
        ),
        ("--worker-rps 12", "give --peak-rps"),
        ("--worker-rps 12 --worker-tps 100 --peak-rps 5", "not both"),
        ("--worker-tps 100 --peak-rps 5", "--tokens-per-request"),
        ("--worker-rps 12 --peak-rps 5 --profile llama3-8b-h100", "--profile need an engine"),
        ("--worker-rps 12 --peak-rps 5 --verify", "--verify need an engine"),
        ("--trace azure_conv --tokens-per-request 9", "goes with --worker-tps"),
    ],
)
def test_errors_exit_2_with_a_reason(args: str, needle: str) -> None:
    res = runner.invoke(app, ["plan", *args.split()])
    assert res.exit_code == 2, res.output
    assert needle in res.stderr, res.stderr
    assert "Traceback" not in res.output


def test_bad_workload_file_names_file_and_field(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(WORKLOAD.replace("arrival_rate_p99_1m: 30", "arrival_rate_p99_1m: fast"))
    res = runner.invoke(app, ["plan", "--workload", str(f)])
    assert res.exit_code == 2
    assert str(f) in res.stderr and "'arrival_rate_p99_1m'" in res.stderr


def test_a_trace_with_embedding_calls_plans_them_as_prefill_only(tmp_path: Path) -> None:
    from velvetrope.sim.trace_request import TraceRequest
    from velvetrope.sim.traces import write_jsonl

    reqs = []
    for i in range(400):
        t = i * 0.05
        if i % 4 == 0:
            reqs.append(TraceRequest(t, 800, 0, "b", endpoint="embeddings"))
        else:
            reqs.append(TraceRequest(t, 300, 120, "a"))
    trace = tmp_path / "mixed.jsonl"
    write_jsonl(reqs, trace)
    args = ["plan", "--trace", str(trace), "--peak-rps", "20", "--service-model", "analytic"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "prompt-only       100 of 400 requests have no output" in r.output
    assert "cut to fit" not in r.output  # an embedding is not a cut request
    # each embedding costs its prefill alone: the mean tokens per request count no output
    assert "tokens per request on average" in r.output
