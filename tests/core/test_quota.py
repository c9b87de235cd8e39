"""Budgets and the ledger as claims (velvetrope.core.quota), on the memory buckets: calendar
windows in a time zone, reserve then settle, weights and prices, the ledger's counts."""

from __future__ import annotations

import math
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from velvetrope.core.bucket import MemoryBuckets, TokenBucket, settle_lines
from velvetrope.core.lifecycle import Reason, Usage, denied
from velvetrope.core.quota import (
    LEDGER_CAP,
    QuotaBook,
    budget_key_parts,
    ledger_rows,
    window_bounds,
)
from velvetrope.core.quota_config import QuotaSettings
from velvetrope.errors import PolicyError

PARIS = ZoneInfo("Europe/Paris")


def epoch(text: str, zone: ZoneInfo = PARIS) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def test_calendar_windows_follow_the_time_zone_and_its_daylight_saving() -> None:
    # 2026-03-29: Paris springs forward; that day has 23 hours
    wid, start, end = window_bounds("day", PARIS, epoch("2026-03-29T12:00"))
    assert (wid, end - start) == ("2026-03-29", 23 * 3600)
    assert start == epoch("2026-03-29T00:00")
    # the day is the time zone's: 00:30 in Paris is still the 6th in UTC
    assert window_bounds("day", PARIS, epoch("2026-12-06T23:30"))[0] == "2026-12-06"
    assert window_bounds("day", ZoneInfo("UTC"), epoch("2026-12-06T23:30"))[0] == "2026-12-06"
    assert window_bounds("day", ZoneInfo("UTC"), epoch("2026-12-07T00:30"))[0] == "2026-12-06"
    # ISO week from Monday; the month's end rolls the year
    wid, start, end = window_bounds("week", PARIS, epoch("2026-12-06T10:00"))  # a Sunday
    assert (wid, start, end) == ("2026-W49", epoch("2026-11-30T00:00"), epoch("2026-12-07T00:00"))
    wid, start, end = window_bounds("month", PARIS, epoch("2026-12-31T23:59"))
    assert (wid, start, end) == ("2026-12", epoch("2026-12-01T00:00"), epoch("2027-01-01T00:00"))


def settings(**kw: object) -> QuotaSettings:
    return QuotaSettings.model_validate({"time_zone": "Europe/Paris", **kw})


def test_a_rate_0_bucket_never_refills_and_says_so() -> None:
    b = TokenBucket(100.0, 0.0, now=0.0)
    assert b.reserve(60.0, 0.0) == 0.0
    assert b.reserve(60.0, 1e9) == math.inf  # no wait grants it
    assert b.time_to_full(1e9) == math.inf
    with pytest.raises(PolicyError):
        TokenBucket(100.0, -1.0)


def test_a_daily_budget_reserves_settles_exactly_and_resets_with_the_next_day() -> None:
    book = QuotaBook(
        settings(budgets=[{"tenant": "acme", "window": "day", "tokens": 1000}], ledger=True)
    )
    buckets = MemoryBuckets()
    now = epoch("2026-12-06T10:00")
    claims = book.claims("acme", "m", 100, 200, now)
    assert [c.owner for c in claims] == ["quota", "ledger", "ledger", "ledger", "ledger"]
    assert claims[0].key == "quota:acme:day:2026-12-06:tok" and claims[0].amount == 300
    assert buckets.take(claims, 0.0) is None
    lines = book.settle("m", claims, settle_lines(claims, 100 + 150), Usage(100, 150))
    buckets.settle(lines, 0.0)
    levels = buckets.levels(0.0)
    assert levels["quota:acme:day:2026-12-06:tok"] == (750.0, 1000.0)
    assert LEDGER_CAP - levels["ledger|2026-12-06|acme|m|input"][0] == 100
    assert LEDGER_CAP - levels["ledger|2026-12-06|acme|m|output"][0] == 150
    assert LEDGER_CAP - levels["ledger|2026-12-06|acme|m|requests"][0] == 1
    # 800 more do not fit in the 750 left: denied until midnight, Paris time
    big = book.claims("acme", "m", 400, 400, now)
    denial = buckets.take(big, 0.0)
    assert denial is not None and denial.key == big[0].key and denial.never
    assert book.reset_s(denial.key, now) == epoch("2026-12-07T00:00") - now
    assert (book.window(denial.key), book.window("quota:nobody")) == ("day", "")
    assert denied(denial.key, 50400.0)[0] is Reason.QUOTA_EXCEEDED
    assert denied("tenant:acme:tok", 1.0)[0] is Reason.RATE_LIMITED
    # the next day is a new bucket, full
    tomorrow = book.claims("acme", "m", 400, 400, epoch("2026-12-07T00:00"))
    assert tomorrow[0].key == "quota:acme:day:2026-12-07:tok"
    assert buckets.take(tomorrow, 0.0) is None


def test_a_refused_job_refunds_its_budget_and_counts_nothing_in_the_ledger() -> None:
    book = QuotaBook(
        settings(budgets=[{"tenant": "*", "window": "month", "tokens": 1000}], ledger=True)
    )
    buckets = MemoryBuckets()
    claims = book.claims("anyone", None, 100, 100, epoch("2026-12-06T10:00"))
    assert claims[0].key == "quota:anyone:month:2026-12:tok"
    assert buckets.take(claims, 0.0) is None
    buckets.settle(book.settle(None, claims, settle_lines(claims, 0), None), 0.0)
    levels = buckets.levels(0.0)
    assert levels[claims[0].key] == (1000.0, 1000.0)
    assert all(levels[c.key][0] == LEDGER_CAP for c in claims[1:])


def test_weights_and_prices_count_what_the_budget_says() -> None:
    book = QuotaBook(
        settings(
            prices={"big": {"input": 3.0, "output": 15.0}, "*": {"input": 1.0, "output": 2.0}},
            budgets=[
                {"tenant": "acme", "window": "month", "cost_usd": 50.0},
                {
                    "tenant": "acme",
                    "model": "big",
                    "window": "rolling",
                    "hours": 24,
                    "tokens": 1e6,
                    "weights": {"input": 1, "output": 4},
                },
            ],
        )
    )
    now = epoch("2026-12-06T10:00")
    big = book.claims("acme", "big", 1000, 100, now)
    assert [c.key for c in big] == ["quota:acme:month:2026-12:usd", "quota:acme:big:rolling24h:tok"]
    assert big[0].amount == pytest.approx((1000 * 3.0 + 100 * 15.0) / 1e6)
    assert big[1].amount == 1000 + 4 * 100 and big[1].rate == pytest.approx(1e6 / 86400)
    used = book.settle("big", big, settle_lines(big, 1300), Usage(1000, 300))
    assert used[0][2] == pytest.approx((1000 * 3.0 + 300 * 15.0) / 1e6)
    assert used[1][2] == 1000 + 4 * 300
    other = book.claims("acme", "small", 1000, 100, now)  # priced by '*', not capped by 'big'
    assert len(other) == 1 and other[0].amount == pytest.approx((1000 + 200) / 1e6)


def test_shadow_mode_reserves_nothing_and_counts_everything() -> None:
    book = QuotaBook(
        settings(enforce=False, budgets=[{"tenant": "acme", "window": "day", "tokens": 10}])
    )
    buckets = MemoryBuckets()
    claims = book.claims("acme", None, 100, 100, epoch("2026-12-06T10:00"))
    assert claims[0].amount == 0.0 and buckets.take(claims, 0.0) is None
    buckets.settle(book.settle(None, claims, settle_lines(claims, 300), Usage(100, 200)), 0.0)
    assert buckets.levels(0.0)[claims[0].key] == (-10.0, 10.0)  # floored at -capacity
    again = book.claims("acme", None, 100, 100, epoch("2026-12-06T11:00"))
    assert buckets.take(again, 0.0) is None  # in debt, and still not refused


def test_ledger_rows_filter_by_day_and_tenant_and_price_at_read_time() -> None:
    s = settings(prices={"m": {"input": 1.0, "output": 2.0}}, ledger=True)
    levels = [
        ("ledger|2026-12-05|acme|m|input", LEDGER_CAP - 1_000_000),
        ("ledger|2026-12-05|acme|m|output", LEDGER_CAP - 10),
        ("ledger|2026-12-05|acme|m|requests", LEDGER_CAP - 2),
        ("ledger|2026-12-06|acme|m|input", LEDGER_CAP - 5),
        ("ledger|2026-12-06|beta||input", LEDGER_CAP - 7),
        ("quota:acme:day:2026-12-06:tok", 3.0),
    ]
    rows = ledger_rows(levels, s)
    assert [(r.day, r.tenant, r.model) for r in rows] == [
        ("2026-12-05", "acme", "m"),
        ("2026-12-06", "acme", "m"),
        ("2026-12-06", "beta", None),
    ]
    assert rows[0].requests == 2 and rows[0].input_tokens == 1_000_000
    assert rows[0].cost_usd == pytest.approx(1.0 + 20 / 1e6)
    assert [r.day for r in ledger_rows(levels, s, "2026-12-06", "2026-12-06", "acme")] == [
        "2026-12-06"
    ]


@pytest.mark.parametrize(
    ("budget", "match"),
    [
        ({"tenant": "a", "window": "day"}, "exactly one of tokens and cost_usd"),
        ({"tenant": "a", "window": "day", "tokens": 1, "cost_usd": 1}, "exactly one"),
        ({"tenant": "a", "window": "rolling", "tokens": 1}, "hours is given"),
        ({"tenant": "a", "window": "day", "hours": 3, "tokens": 1}, "hours is given"),
    ],
)
def test_a_budget_says_what_it_counts_and_over_what(budget: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        settings(budgets=[budget])


def test_unknown_time_zones_and_twin_budgets_are_refused() -> None:
    with pytest.raises(ValidationError, match="unknown time zone"):
        settings(time_zone="Mars/Olympus")
    twin = {"tenant": "a", "window": "day", "tokens": 5}
    with pytest.raises(ValidationError, match="over the same window"):
        settings(budgets=[twin, twin])


def test_budget_keys_split_and_burn_shows_the_current_windows_only() -> None:
    assert budget_key_parts("quota:acme:day:2026-12-06:tok") == ("acme", "day", "2026-12-06", "tok")
    assert budget_key_parts("quota:acme:m-70b:month:2026-12:usd") == (
        "acme:m-70b", "month", "2026-12", "usd",
    )  # fmt: skip
    assert budget_key_parts("quota:acme:rolling6h:tok") == ("acme", "rolling6h", None, "tok")
    assert budget_key_parts("tenant:acme:tok") is None
    book = QuotaBook(settings())
    now = epoch("2026-12-06T22:00")  # two hours to midnight, Paris
    levels = [
        ("quota:acme:day:2026-12-06:tok", (700.0, 1000.0)),
        ("quota:acme:day:2026-12-05:tok", (0.0, 1000.0)),  # yesterday's: left out
        ("quota:acme:rolling6h:tok", (-5.0, 50.0)),
        ("tenant:acme:tok", (1.0, 2.0)),
    ]
    got = [(b.scope, b.window, b.used, b.limit, b.reset_s) for b in book.burn(levels, now)]
    assert got == [("acme", "day", 300.0, 1000.0, 7200.0), ("acme", "rolling6h", 55.0, 50.0, None)]


def test_cached_input_settles_at_its_own_weight_and_price_and_counts_in_the_ledger() -> None:
    book = QuotaBook(
        settings(
            budgets=[
                {"tenant": "acme", "window": "day", "tokens": 10_000,
                 "weights": {"input": 1, "cached_input": 0.25, "output": 4}},
                {"tenant": "acme", "window": "month", "cost_usd": 10.0},
            ],
            prices={"m": {"input": 1.0, "cached_input": 0.5, "output": 2.0}},
            ledger=True,
        )
    )  # fmt: skip
    buckets = MemoryBuckets()
    now = epoch("2026-12-06T10:00")
    claims = book.claims("acme", "m", 1000, 100, now)
    assert claims[0].amount == 1000 + 100 * 4  # reserved as if nothing were cached
    assert buckets.take(claims, 0.0) is None
    usage = Usage(1000, 50, 800)  # 800 of the 1,000 prompt tokens found cached
    lines = book.settle("m", claims, settle_lines(claims, usage.total), usage)
    buckets.settle(lines, 0.0)
    levels = buckets.levels(0.0)
    assert levels["quota:acme:day:2026-12-06:tok"][0] == 10_000 - (200 + 800 * 0.25 + 50 * 4)
    assert levels["quota:acme:month:2026-12:usd"][0] == pytest.approx(
        10.0 - (200 * 1.0 + 800 * 0.5 + 50 * 2.0) / 1e6
    )
    counts = {k.rsplit("|", 1)[1]: LEDGER_CAP - lvl for k, (lvl, _) in levels.items() if "|" in k}
    assert counts == {"requests": 1, "input": 1000, "cached": 800, "output": 50}
    (row,) = ledger_rows([(k, lvl) for k, (lvl, _) in levels.items()], book.settings)
    assert (row.input_tokens, row.cached_input_tokens, row.output_tokens) == (1000, 800, 50)
    assert row.cost_usd == pytest.approx((200 * 1.0 + 800 * 0.5 + 50 * 2.0) / 1e6)
    # an engine that reports no cached count: every prompt token is charged as input
    claims = book.claims("acme", "m", 1000, 100, now)
    assert buckets.take(claims, 0.0) is None
    plain = Usage(1000, 50)
    buckets.settle(book.settle("m", claims, settle_lines(claims, plain.total), plain), 0.0)
    assert buckets.levels(0.0)["quota:acme:day:2026-12-06:tok"][0] == 10_000 - 600 - 1200


def test_ledger_rows_read_a_day_written_before_the_cached_counter_as_none_cached() -> None:
    s = settings(prices={"m": {"input": 1.0, "cached_input": 0.1, "output": 2.0}}, ledger=True)
    old = [
        ("ledger|2026-11-30|acme|m|input", LEDGER_CAP - 100),
        ("ledger|2026-11-30|acme|m|output", LEDGER_CAP - 10),
        ("ledger|2026-11-30|acme|m|requests", LEDGER_CAP - 1),
    ]
    (row,) = ledger_rows(old, s)
    assert (row.requests, row.input_tokens, row.cached_input_tokens, row.output_tokens) == (
        1, 100, 0, 10,
    )  # fmt: skip
    assert row.cost_usd == pytest.approx((100 * 1.0 + 10 * 2.0) / 1e6)
