"""Metrics: percentiles, Jain's index, SLO parsing, goodput and the per-tier summary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from velvetrope.core.policy import SloPolicy
from velvetrope.errors import PolicyError
from velvetrope.sim.metrics import (
    DEFAULT_SLO,
    JobRecords,
    goodput_mask,
    jain_index,
    parse_slo,
    percentiles,
    slo_for,
    slo_text,
    summarize,
    within_slo,
)

NAN = math.nan


def records(rows: list[tuple[float, float, float, float, str, str, str, str, int]]) -> JobRecords:
    """rows: (arrival, dispatched, first_token, end, state, reason, tenant, tier, output)."""
    cols = list(zip(*rows, strict=True))
    n = len(rows)
    return JobRecords(
        arrival=np.array(cols[0], dtype=float),
        dispatched=np.array(cols[1], dtype=float),
        first_token=np.array(cols[2], dtype=float),
        end=np.array(cols[3], dtype=float),
        state=np.array(cols[4], dtype=np.str_),
        reason=np.array(cols[5], dtype=np.str_),
        tenant=np.array(cols[6], dtype=np.str_),
        tier=np.array(cols[7], dtype=np.str_),
        prompt=np.full(n, 100, dtype=np.int64),
        output=np.array(cols[8], dtype=np.int64),
        predicted=np.full(n, -1, dtype=np.int64),
    )


def test_percentiles_interpolate_linearly() -> None:
    assert percentiles([1, 2, 3, 4], [50, 100]) == (2.5, 4.0)
    assert percentiles(list(range(101)), [90, 99]) == (90.0, 99.0)
    assert all(math.isnan(x) for x in percentiles([], [50, 99]))


def test_jain_index() -> None:
    assert jain_index([1, 1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([3, 1]) == pytest.approx(16 / 20)
    assert jain_index([0, 0]) == 1.0
    assert math.isnan(jain_index([]))
    with pytest.raises(PolicyError):
        jain_index([1, -1])


def test_parse_slo() -> None:
    assert parse_slo("gold=ttft:0.5,tpot:0.05") == ("gold", SloPolicy(ttft_s=0.5, tpot_s=0.05))
    assert parse_slo("*=e2e:30") == ("*", SloPolicy(e2e_s=30.0))
    for bad in ("gold", "gold=", "gold=latency:1", "gold=ttft:x", "gold=ttft:-1", "gold=e2e:inf"):
        with pytest.raises(PolicyError):
            parse_slo(bad)


def test_within_slo_checks_only_the_bounds_set_and_a_nan_tpot_passes() -> None:
    ttft = np.array([1.0, 3.0, 1.0, 1.0])
    tpot = np.array([0.05, 0.05, 0.5, NAN])
    e2e = np.array([2.0, 4.0, 9.0, 1.0])
    both = SloPolicy(ttft_s=2.0, tpot_s=0.1)
    assert within_slo(both, ttft, tpot, e2e).tolist() == [True, False, False, True]
    assert within_slo(SloPolicy(e2e_s=3.0), ttft, tpot, e2e).tolist() == [True, False, False, True]
    assert within_slo(SloPolicy(), ttft, tpot, e2e).all()
    assert slo_text(both) == "TTFT ≤ 2 s, TPOT ≤ 0.1 s"
    assert (slo_text(SloPolicy()), slo_text(None)) == ("none", "")


def test_slo_for_falls_back_to_star_then_default() -> None:
    star = SloPolicy(ttft_s=5.0)
    own = SloPolicy(ttft_s=1.0)
    assert slo_for("a", {"a": own}) == own
    assert slo_for("b", {"a": own, "*": star}) == star
    assert slo_for("b", {}) == DEFAULT_SLO


def test_goodput_counts_completed_requests_within_their_tier_slo() -> None:
    rec = records(
        [
            (0, 0, 1.0, 2.0, "completed", "completed", "x", "gold", 11),  # ttft 1, tpot .1
            (0, 0, 3.0, 4.0, "completed", "completed", "x", "gold", 11),  # ttft 3 > 2
            (0, 0, 1.0, 9.0, "completed", "completed", "x", "gold", 11),  # tpot .8 > .1
            (0, 0, 1.0, 1.0, "completed", "completed", "x", "gold", 1),  # one token: no tpot
            (0, 0, 3.0, 4.0, "completed", "completed", "y", "bronze", 11),  # bronze: ttft<=5
            (0, NAN, NAN, 0.5, "rejected", "queue_full", "y", "bronze", 11),
            (0, 0, 1.0, 2.0, "cancelled", "cancelled", "y", "bronze", 11),
        ]
    )
    slos = {"gold": SloPolicy(ttft_s=2.0, tpot_s=0.1), "bronze": SloPolicy(ttft_s=5.0)}
    assert goodput_mask(rec, slos).tolist() == [True, False, False, True, True, False, False]


def test_summarize_rows_and_outcomes() -> None:
    rec = records(
        [
            (0, 0.5, 1.0, 2.0, "completed", "completed", "x", "gold", 11),
            (0, 0.1, 3.0, 4.0, "completed", "completed", "y", "bronze", 11),
            (0, NAN, NAN, 0.5, "rejected", "queue_full", "y", "bronze", 11),
            (1, NAN, NAN, 2.0, "expired", "expired", "z", "bronze", 11),
        ]
    )
    rows = summarize(rec, {}, span_s=10.0, tiers=["gold", "silver", "bronze"])
    assert [r.tier for r in rows] == ["gold", "bronze", "all"]
    gold, bronze, overall = rows
    assert (gold.offered, gold.completed, gold.good) == (1, 1, 1)
    assert gold.queue == (0.5, 0.5, 0.5)
    assert bronze.outcomes == {"expired": 1, "queue_full": 1}
    assert bronze.good == 0  # ttft 3 s > default 2 s
    assert overall.goodput_frac == pytest.approx(0.25)
    assert overall.goodput_rps == pytest.approx(0.1)
    # served fractions: x 1, y 1/2, z 0  ->  (1.5)^2 / (3 * 1.25)
    assert overall.jain == pytest.approx(2.25 / 3.75)
    assert bronze.jain == pytest.approx(0.25 / (2 * 0.25))
