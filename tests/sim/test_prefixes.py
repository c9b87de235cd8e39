"""Shared prompt prefixes in simulated workloads: requests, traces, the loop and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.errors import PolicyError
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.prefixes import with_system_prompts
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import read_jsonl, write_jsonl


def test_requests_validate_their_prefix() -> None:
    r = TraceRequest(0.0, 100, 5, prefix_id="sys", prefix_tokens=40)
    assert (r.prefix_id, r.prefix_tokens) == ("sys", 40)
    with pytest.raises(PolicyError, match="prefix_tokens"):
        TraceRequest(0.0, 100, 5, prefix_id="sys", prefix_tokens=101)
    with pytest.raises(PolicyError, match="prefix_id"):
        TraceRequest(0.0, 100, 5, prefix_tokens=10)


def test_system_prompts_are_per_tenant_and_capped_by_the_prompt() -> None:
    work = [TraceRequest(0.0, 300, 5, "a"), TraceRequest(1.0, 80, 5, "b")]
    got = with_system_prompts(work, 128)
    assert [(r.prefix_id, r.prefix_tokens) for r in got] == [("system:a", 128), ("system:b", 80)]
    assert with_system_prompts(got, 0) == work
    with pytest.raises(PolicyError):
        with_system_prompts(work, -1)


def test_jsonl_round_trips_prefixes(tmp_path: Path) -> None:
    work = [TraceRequest(0.0, 300, 5, "a", prefix_id="system:a", prefix_tokens=128)]
    write_jsonl(work, tmp_path / "w.jsonl")
    assert read_jsonl(tmp_path / "w.jsonl") == work


def test_a_shared_system_prompt_cuts_time_to_first_token() -> None:
    prof = load_profile("llama3-8b-h100").with_overrides(enable_prefix_caching=True)
    # the same 2,000-token system prompt, requests far enough apart that each runs alone
    work = [TraceRequest(10.0 * i, 2100, 4) for i in range(4)]
    plain = run_simulation(PolicyConfig(), work, 1, prof).records
    shared = run_simulation(PolicyConfig(), with_system_prompts(work, 2000), 1, prof).records
    first = prof.step_time(2100, 0, 2100)
    for i in range(4):
        assert plain.first_token[i] - plain.arrival[i] == pytest.approx(first)
    assert shared.first_token[0] - shared.arrival[0] == pytest.approx(first)
    # later requests find the 2,000 tokens (125 full blocks) cached and compute the other 100
    cached = prof.step_time(2100 - 2000, 0, 2100)
    for i in range(1, 4):
        assert shared.first_token[i] - shared.arrival[i] == pytest.approx(cached)


def test_simulate_cli_takes_a_system_prompt(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_jsonl([TraceRequest(0.5 * i, 1200, 20, "a") for i in range(40)], trace)
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            str(trace),
            "--replicas",
            "1",
            "--system-prompt",
            "1000",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "report:" in res.output
