"""``velvetrope demo``: the summaries' arithmetic, and quick end-to-end runs on loopback."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from velvetrope.config import load_config
from velvetrope.core.policy import SloPolicy
from velvetrope.demo import DEFAULT_CONFIG, DemoSettings, run_demo, slo_met, summarize
from velvetrope.demo.replay_results import ReplayOutcome, RequestResult
from velvetrope.demo.run import engine_priorities
from velvetrope.demo.settings import RUN_LABEL, RUNS
from velvetrope.errors import ConfigError, PolicyError

DONE = ReplayOutcome.COMPLETED


def _r(tier: str, outcome: ReplayOutcome, **kw: object) -> RequestResult:
    base = RequestResult(0, "t", tier, "http://x", 10, 10, 0.0)
    base.outcome = outcome
    for k, v in kw.items():
        setattr(base, k, v)
    return base


def test_summarize_counts_percentiles_and_goodput() -> None:
    done = [
        _r(
            "a",
            ReplayOutcome.COMPLETED,
            status=200,
            ttft_s=0.1 * i,
            e2e_s=1.0 + i,
            elapsed_s=1.0 + i,
        )
        for i in range(1, 11)
    ]
    rest = [
        _r("a", ReplayOutcome.REJECTED, status=503, error_code="queue_full"),
        _r("a", ReplayOutcome.REJECTED, status=503, error_code="queue_full"),
        _r("a", ReplayOutcome.REJECTED, status=429, error_code="rate_limited"),
        _r("a", ReplayOutcome.TIMEOUT, status=200, error_code="client_timeout", elapsed_s=30.0),
        _r("b", ReplayOutcome.COMPLETED, status=200, ttft_s=5.0, e2e_s=6.0),
    ]
    slos = {"a": SloPolicy(ttft_s=0.5), "b": SloPolicy(e2e_s=5.0)}
    a, b = summarize("gateway", done + rest, 2.0, slos, ["a", "b"])
    assert (a.requests, a.completed, a.cut, a.errors) == (14, 10, 1, 0)
    assert a.rejected == {"queue_full": 2, "rate_limited": 1} and a.rejected_total == 3
    assert a.within_slo == 5 and a.goodput_rps == 2.5  # TTFT 0.1..0.5 s
    # 11 latency samples; the cut one never got a token: a lower bound past every other.
    assert str(a.ttft_p50) == "0.60" and str(a.ttft_p99) == "≥30.00"
    assert str(a.e2e_p50) == "7.00" and a.e2e_p99.lower_bound
    assert b.within_slo == 0 and b.completed == 1 and str(b.e2e_p99) == "6.00"


def test_slo_met_uses_the_simulators_definitions() -> None:
    slo = SloPolicy(ttft_s=1.0, tpot_s=0.1)
    ok = _r("a", ReplayOutcome.COMPLETED, ttft_s=0.5, e2e_s=0.5 + 0.1 * 10, tokens=11)
    slow = _r("a", ReplayOutcome.COMPLETED, ttft_s=0.5, e2e_s=0.5 + 0.2 * 10, tokens=11)
    one = _r("a", ReplayOutcome.COMPLETED, ttft_s=0.9, e2e_s=5.0, tokens=1)  # no TPOT: passes
    late = _r("a", ReplayOutcome.COMPLETED, ttft_s=1.5, e2e_s=2.0, tokens=2)
    cut = _r("a", ReplayOutcome.TIMEOUT, ttft_s=0.1, tokens=3)
    assert [slo_met(r, slo) for r in (ok, slow, one, late, cut)] == [
        True,
        False,
        True,
        False,
        False,
    ]


def test_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(PolicyError):
        DemoSettings(window_s=0)
    with pytest.raises(PolicyError):
        DemoSettings(overload=float("nan"))
    with pytest.raises(PolicyError, match="engine_args"):
        DemoSettings(engine_args="--set max_num_seqs=4")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not found"):
        run_demo(DemoSettings.quick(config_path=tmp_path / "missing.yaml"))


def test_engine_priorities_follow_the_pools_engine_priority(tmp_path: Path) -> None:
    # The shipped config forwards the engine priority: the engines run in priority mode
    # and the third run sends each tier's index.
    shipped = engine_priorities(load_config(DEFAULT_CONFIG).policy)
    assert shipped == {"interactive": 0, "standard": 1, "batch": 2}
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for pool in data["policy"]["pools"]:
        pool["engine_priority"] = False
    off = tmp_path / "gateway.yaml"
    off.write_text(yaml.safe_dump(data))
    assert engine_priorities(load_config(off).policy) is None


@pytest.mark.integration
def test_quick_demo_prints_the_table_writes_the_plot_and_stops_everything(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    console = Console(file=out, width=220)
    report = run_demo(DemoSettings.quick(out_dir=tmp_path), console)
    text = out.getvalue()
    for word in ("interactive", "standard", "batch", "p99", *RUN_LABEL.values()):
        assert word in text
    assert "run 3/3: straight to the engines" in text
    assert "--scheduling priority" in text and report.scheduling == "priority"
    assert "in SLO, gateway vs engines (priority): interactive " in text
    for tier, g, o in report.versus("direct_priority"):
        assert f"{tier} {g} {'≥' if g >= o else '<'} {o}" in text
    for run in RUNS:
        wasted = f"{report.tokens_wasted(run):,}; loadgen"
        assert f"{RUN_LABEL[run]}: " in text and wasted in text
    assert f"plot: {tmp_path / 'demo.png'}" in text
    assert report.plot_path is not None and report.plot_path.stat().st_size > 10_000
    assert list(report.runs) == list(RUNS)
    assert len(report.summaries) == 9
    for run in RUNS:
        rows = [s for s in report.summaries if s.run == run]
        assert sum(s.requests for s in rows) == report.workload_size > 50
        results = report.runs[run].replay.results
        assert sum(r.outcome is ReplayOutcome.COMPLETED for r in results) > 0
        assert all(
            r.tokens == r.max_tokens for r in results if r.outcome is ReplayOutcome.COMPLETED
        )
        assert report.runs[run].samples  # the servers were polled while it ran
    assert report.problems == []  # no error answers from the gateway or the engines
    assert report.offered_rps > report.capacity.engines_rps  # it is an overload
    assert len(report.pids) == 3
    for pid in report.pids:  # every process it started is gone (and reaped)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.integration
def test_the_engine_priority_run_sends_the_tier_to_engines_in_priority_mode(
    tmp_path: Path,
) -> None:
    # Four seats per engine: most of the overload waits in the engines' own queues, where
    # only a priority the engine received can put interactive requests ahead of batch ones.
    seats = ("--set", "max_num_seqs=4")
    report = run_demo(
        DemoSettings.quick(out_dir=tmp_path, engine_args=seats),
        Console(file=io.StringIO(), width=220),
    )
    assert report.scheduling == "priority"
    assert report.priorities == {"interactive": 0, "standard": 1, "batch": 2}

    def started(run: str, tier: str) -> float:
        """The share of ``tier``'s requests that got a first token before the cut."""
        rs = [r for r in report.runs[run].replay.results if r.tier == tier]
        return sum(r.ttft_s is not None for r in rs) / len(rs)

    # Same engines, no priority field: first come, first served, the tiers alike.
    assert started("direct", "interactive") < 3 * started("direct", "batch")
    # The tier as the priority: interactive (0) starts long before batch (2).
    assert started("direct_priority", "interactive") > 3 * started("direct_priority", "batch")
    assert report.problems == []
