"""Planner workloads: from traces (the p99 one-minute rate) and from YAML (errors name file
and field)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from velvetrope.errors import ConfigError, PolicyError
from velvetrope.planner.workload import (
    PATTERN_SIZE,
    YAML_SAMPLE_SIZE,
    arrival_pattern,
    gap_scv,
    load_workload,
    one_minute_rates,
    parse_workload,
    workload_from_trace,
)
from velvetrope.sim import TraceRequest, load_trace, write_jsonl

GOOD = """\
name: chat
prompt_tokens: {p50: 1000, p99: 4000}
output_tokens: {p50: 130, p99: 600}
arrival_rate_p99_1m: 8.2
arrival_rate_mean: 5.5
arrival_cv: 1.5
tenants:
  - {name: small, share: 1}
  - {name: big, share: 3}
"""


def test_one_minute_rates() -> None:
    times = [0.0, 1.0, 59.9, 60.0, 130.0, 179.0, 185.0]  # minutes: 3, 1, 2; 185 s is partial
    assert one_minute_rates(times).tolist() == pytest.approx([3 / 60, 1 / 60, 2 / 60])
    with pytest.raises(PolicyError, match="fewer than two whole minutes"):
        one_minute_rates([0.0, 30.0, 100.0])


def test_trace_design_rate_is_p99_of_minutes_not_mean(tmp_path: Path) -> None:
    # 10 quiet minutes at 1 req/s, then one busy minute at 5 req/s.
    times = [i * 1.0 for i in range(600)] + [600 + i * 0.2 for i in range(300)]
    times.append(660.0)  # closes the busy minute
    reqs = [
        TraceRequest(t, 100 + i % 7, 20 + i % 5, "a" if i % 4 else "b") for i, t in enumerate(times)
    ]
    path = tmp_path / "w.jsonl"
    write_jsonl(reqs, path)
    w = workload_from_trace(path)
    rates = np.array([1.0] * 10 + [5.0])
    assert w.design_rps == pytest.approx(float(np.percentile(rates, 99)))
    assert w.mean_rps is not None and w.mean_rps < 1.5 < w.design_rps
    assert w.name == "w" and w.source == f"trace {path}"
    assert "p99 of the one-minute arrival rate" in w.design_rate_origin
    assert len(w.prompt) == len(reqs)
    # shares by tokens sent, largest first
    tok = {"a": 0, "b": 0}
    for r in reqs:
        tok[r.tenant] += r.prompt_tokens + r.output_tokens
    assert [t.name for t in w.tenants] == ["a", "b"]
    assert w.tenants[0].share == pytest.approx(tok["a"] / sum(tok.values()))
    fixed = workload_from_trace(path, design_rps=50.0)
    assert fixed.design_rps == 50.0
    again = w.with_design_rate(7.0, "because")
    assert (again.design_rps, again.design_rate_origin) == (7.0, "because")


def test_builtin_conversation_trace() -> None:
    reqs = load_trace("azure_conv")
    w = workload_from_trace("azure_conv", requests=reqs)
    t = np.array([r.t for r in reqs])
    k = int(t[-1] // 60)
    counts = np.bincount((t[t < 60 * k] // 60).astype(int), minlength=k) / 60
    assert w.design_rps == pytest.approx(float(np.percentile(counts, 99)))
    assert w.name == "azure_conv"
    assert 1.0 < w.arrival_scv < 1.2  # gaps inside minutes: close to Poisson
    assert w.whole_trace_scv is not None and 1.15 < w.whole_trace_scv < 1.25
    assert w.prompt_p50 == 1020 and w.output_p99 == 601
    assert w.arrival_pattern is not None and len(w.arrival_pattern) > 19_000


def test_code_trace_is_bursty_inside_minutes_too() -> None:
    w = workload_from_trace("azure_code")
    assert w.whole_trace_scv is not None and w.whole_trace_scv > 150  # idle minutes included
    assert 30 < w.arrival_scv < 80  # what is left once every minute runs at one rate
    assert w.arrival_pattern is not None
    assert w.arrival_scv == pytest.approx(gap_scv(w.arrival_pattern))


def test_arrival_pattern_runs_every_minute_at_one_rate() -> None:
    # minutes from the first arrival: 3 arrivals, none, 2; the one at 185 s is in a partial
    # minute and drops out
    pat = arrival_pattern(np.array([0.0, 20.0, 40.0, 125.0, 150.0, 185.0]))
    # minute 0 becomes [0, 3): 0, 20 and 40 s scaled by 3/60; minute 2 becomes [3, 5)
    assert pat.tolist() == pytest.approx([0.0, 1.0, 2.0, 3 + 5 * 2 / 60, 4.0])
    # shorter than two whole minutes: scaled as a whole to one arrival per second
    assert arrival_pattern(np.array([5.0, 6.0, 9.0])).tolist() == pytest.approx([0.0, 0.5, 2.0])
    with pytest.raises(PolicyError):
        arrival_pattern(np.array([3.0, 3.0]))


def test_yaml_workload_has_a_seeded_arrival_pattern() -> None:
    w = parse_workload(GOOD)
    again = parse_workload(GOOD)
    assert w.arrival_pattern is not None and again.arrival_pattern is not None
    assert len(w.arrival_pattern) == PATTERN_SIZE
    assert np.array_equal(w.arrival_pattern, again.arrival_pattern)
    assert float(w.arrival_pattern[-1]) == pytest.approx(PATTERN_SIZE, rel=0.05)  # 1 req/s
    assert gap_scv(w.arrival_pattern) == pytest.approx(1.5**2, rel=0.2)  # arrival_cv: 1.5
    even = parse_workload(GOOD.replace("arrival_cv: 1.5", "arrival_cv: 0"))
    assert even.arrival_pattern is not None and gap_scv(even.arrival_pattern) < 1e-12


def test_yaml_workload(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(GOOD)
    w = load_workload(f)
    assert (w.name, w.design_rps, w.mean_rps, w.arrival_scv) == ("chat", 8.2, 5.5, 2.25)
    assert [(t.name, t.share) for t in w.tenants] == [("big", 0.75), ("small", 0.25)]
    assert len(w.prompt) == YAML_SAMPLE_SIZE
    # the lognormal fitted to p50/p99 reproduces them (sampling error ~ a few %)
    assert float(np.percentile(w.prompt, 50)) == pytest.approx(1000, rel=0.05)
    assert float(np.percentile(w.prompt, 99)) == pytest.approx(4000, rel=0.1)
    assert float(np.percentile(w.output, 99)) == pytest.approx(600, rel=0.1)
    assert np.array_equal(load_workload(f).output, w.output)  # seeded: same file, same mix
    minimal = parse_workload(
        "prompt_tokens: {p50: 10, p99: 10}\noutput_tokens: {p50: 5, p99: 50}\n"
        "arrival_rate_p99_1m: 3\n",
        "dir/min.yaml",
    )
    assert minimal.name == "min" and minimal.arrival_scv == 1.0
    assert [t.name for t in minimal.tenants] == ["default"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (GOOD.replace("arrival_rate_p99_1m: 8.2\n", ""), "'arrival_rate_p99_1m': required"),
        (GOOD.replace("p99: 600", "p99: 60"), "field 'output_tokens'"),
        (GOOD.replace("p50: 1000", "p50: -3"), "field 'prompt_tokens.p50'"),
        (GOOD.replace("arrival_cv: 1.5", "arrival_cv: yes"), "field 'arrival_cv'"),
        (GOOD.replace("arrival_rate_mean: 5.5", "arrival_rate_mean: 9"), "arrival_rate_mean"),
        (GOOD + "colour: red\n", "unknown field 'colour'"),
        (GOOD.replace("name: big", "name: small"), "listed twice: small"),
        (GOOD.replace("share: 3", "share: 0"), "field 'tenants.1.share'"),
        ("- a list\n", "must be a YAML mapping"),
        ("prompt_tokens: {p50: 1\n", "not valid YAML"),
    ],
)
def test_yaml_errors_name_file_and_field(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_workload(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}:"), msg
    assert needle in msg, msg


def test_missing_workload_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_workload(tmp_path / "nope.yaml")
