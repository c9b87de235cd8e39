from __future__ import annotations

import math

import pytest

from velvetrope.core.bucket import Claim, Denial, Grant, MemoryBuckets, TokenBucket, settle_lines
from velvetrope.errors import PolicyError


def test_reserve_grants_until_empty_then_says_when() -> None:
    b = TokenBucket(100, 10)  # 10 tokens/s
    assert b.reserve(60, 0.0) == 0.0
    assert b.level == 40
    wait = b.reserve(60, 0.0)
    assert wait == pytest.approx(2.0)
    assert b.level == 40  # nothing taken on a denial
    assert b.reserve(60, 2.0) == 0.0


def test_cost_above_capacity_is_never_granted() -> None:
    b = TokenBucket(100, 10)
    assert math.isinf(b.reserve(101, 0.0))
    assert b.level == 100


def test_settle_refunds_unused_and_charges_overrun() -> None:
    b = TokenBucket(1000, 1)
    b.reserve(500, 0.0)
    b.settle(500, 200, 0.0)  # used 200 of 500: refund 300
    assert b.level == pytest.approx(800)
    b.reserve(800, 0.0)
    b.settle(800, 1500, 0.0)  # overran by 700: balance goes negative
    assert b.level == pytest.approx(-700)
    # a negative balance delays the next request: 100 tokens need 800 s of refill
    assert b.wait_for(100, 0.0) == pytest.approx(800)


def test_debt_is_clamped_at_the_floor() -> None:
    b = TokenBucket(100, 1, floor=-50)
    b.reserve(100, 0.0)
    b.settle(100, 10_000, 0.0)
    assert b.level == -50


def test_refill_caps_at_capacity() -> None:
    b = TokenBucket(100, 10)
    b.reserve(100, 0.0)
    assert b.refill(1000.0) == 100


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(PolicyError):
        TokenBucket(0, 1)
    with pytest.raises(PolicyError):
        TokenBucket(10, -1)  # rate 0 is a budget that never refills; below 0 is nothing
    with pytest.raises(PolicyError):
        TokenBucket(10, math.nan)
    with pytest.raises(PolicyError):
        TokenBucket(10, 1, floor=5)


def test_ledger_reserves_all_or_nothing() -> None:
    led = MemoryBuckets()
    claims = [tok("a", 60, 100, 1), tok("b", 60, 50, 1)]
    res = led.reserve(claims, 0.0)
    assert isinstance(res, Denial)
    assert res.key == "b"
    assert res.retry_after_s == math.inf  # 60 > capacity 50
    a = led.get("a")
    assert a is not None
    assert a.level == 100  # 'a' was not touched
    ok = led.reserve([tok("a", 60, 100, 1), tok("b", 40, 50, 1)], 0.0)
    assert isinstance(ok, Grant)
    assert [(c.key, c.amount) for c in ok.claims] == [("a", 60), ("b", 40)]
    led.settle([("a", 60, 10), ("b", 40, 40)], 0.0)
    assert led.levels(0.0) == {"a": (90, 100), "b": (10, 50)}


def tok(key: str, amount: float, capacity: float, rate: float) -> Claim:
    return Claim(key, "tokens", "tenant", amount, capacity, rate)


def test_settle_is_idempotent_per_job_id() -> None:
    led = MemoryBuckets(remember=2)
    led.reserve([tok("a", 60, 100, 1)], 0.0)
    assert led.settle([("a", 60, 10)], 0.0, job_id="j1")
    assert not led.settle([("a", 60, 10)], 0.0, job_id="j1")
    assert led.levels(0.0)["a"] == (90, 100)
    led.settle([], 0.0, job_id="j2")
    led.settle([], 0.0, job_id="j3")  # j1 falls out of the window of 2
    assert led.settle([("a", 0, 5)], 0.0, job_id="j1")
    assert led.levels(0.0)["a"] == (85, 100)


def test_settle_lines_charge_tokens_and_refund_unused_request_slots() -> None:
    claims = [tok("t", 150, 1000, 1), Claim("r", "requests", "tenant", 1, 10, 1)]
    assert settle_lines(claims, 120) == (("t", 150, 120), ("r", 1, 1))
    assert settle_lines(claims, 0) == (("t", 150, 0), ("r", 1, 0))


def test_ledger_denial_reports_the_longest_wait() -> None:
    led = MemoryBuckets()
    led.reserve([tok("a", 90, 100, 10), tok("b", 10, 100, 1)], 0.0)
    res = led.reserve([tok("a", 30, 100, 10), tok("b", 95, 100, 1)], 0.0)
    assert isinstance(res, Denial)
    assert res.key == "b"
    assert res.retry_after_s == pytest.approx(5.0)
    snap = {s.key: s for s in res.snapshots}
    assert snap["a"].remaining == pytest.approx(10)
    assert snap["a"].limit == 100


def test_a_grant_with_snapshots_shows_the_buckets_after_the_reservation() -> None:
    led, plain = MemoryBuckets(), MemoryBuckets()
    claims = [tok("a", 30, 100, 2), tok("b", 5, 50, 1), tok("a", 10, 100, 2)]
    for t in (0.0, 20.0, 30.5):
        got = led.reserve(claims, t, with_snapshots=True)
        ref = plain.reserve(claims, t)
        assert isinstance(got, Grant) and isinstance(ref, Grant) and ref.snapshots == ()
        assert got.claims == ref.claims
        assert got.snapshots == plain.snapshots(claims, t)  # what a separate read says
    assert got.snapshots[0].remaining == got.snapshots[2].remaining  # one bucket, one level


def test_take_reserves_like_reserve_without_a_grant() -> None:
    """``take`` (the controller's path) moves the buckets exactly as ``reserve`` does and
    denies with the same Denial, reserving nothing."""
    taken, reserved = MemoryBuckets(), MemoryBuckets()
    for t, amounts in ((0.0, (60, 30)), (1.0, (30, 30)), (1.5, (5, 60)), (2.0, (1, 1))):
        claims = (tok("a", amounts[0], 100, 10), tok("b", amounts[1], 50, 1))
        denial = taken.take(claims, t)
        res = reserved.reserve(list(claims), t)
        if denial is None:
            assert isinstance(res, Grant)
            assert res.claims == claims
        else:
            assert res == denial
        assert taken.levels(t) == reserved.levels(t)


def test_settle_lines_of_one_claim() -> None:
    assert settle_lines((tok("t", 150, 1000, 1),), 120) == (("t", 150, 120),)
    req = Claim("r", "requests", "tenant", 1, 10, 1)
    assert settle_lines([req], 7) == (("r", 1, 1),)
    assert settle_lines([req], 0) == (("r", 1, 0),)
