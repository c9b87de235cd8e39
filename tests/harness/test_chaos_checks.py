"""The chaos run's checks on made-up records: each counts what it should, and only that."""

from __future__ import annotations

from typing import Any

from harness.chaos_checks import (
    Verdict,
    gateway_prompt_tokens,
    inflight,
    ledger,
    outcomes,
    priority,
    settlement,
    statuses,
)
from harness.chaos_deployment import TENANTS
from harness.chaos_load import Shot
from harness.chaos_state import JournalEntry, RedisView, state_context
from tests.support.prometheus import metric_sum

INTERACTIVE, BATCH = TENANTS[0], TENANTS[2]


def shot(rid: str, **kw: Any) -> Shot:
    s = Shot(0, rid, 0.0, kw.pop("tenant", INTERACTIVE), True, 10, 0, "", 0.0)
    s.sent_at, s.gateway, s.incarnation, s.outcome = 0.0, "gw", 0, "answered"
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def entry(rid: str, start: float, end: float | None, engine: str = "e", **kw: Any) -> JournalEntry:
    e = JournalEntry(engine, 0, "id-" + rid, rid, start, kw.pop("prompt", 5), True, end)
    for k, v in kw.items():
        setattr(e, k, v)
    return e


# -- inflight ------------------------------------------------------------------------------------


def test_inflight_counts_the_starts_above_the_limit_across_engines() -> None:
    v = Verdict("p")
    entries = [
        entry("a", 0.0, 3.0, "e1"),
        entry("b", 1.0, 4.0, "e2"),
        entry("c", 2.0, 2.5, "e1"),  # the third at once: over a limit of 2
        entry("d", 3.0, 5.0, "e2"),  # starts as "a" ends: ends count first, not over
    ]
    shots = [shot(r, gateway=g) for r, g in (("a", "g1"), ("b", "g2"), ("c", "g1"), ("d", "g2"))]
    inflight(shots, entries, {}, 2, 0.0, v)
    assert v.counts["inflight_over_limit"] == 1
    assert "held at most 3" in v.details[0] and "500 ms" in v.details[0]
    assert "first over at 2.00s ({'g1#0': 2, 'g2#0': 1})" in v.details[0]  # who held them


def test_inflight_ends_a_killed_engines_requests_at_the_kill_and_hangups_at_the_hangup() -> None:
    v = Verdict("p")
    entries = [
        entry("a", 0.0, None, "e1"),  # no end: its engine was SIGKILLed at 1.0
        entry("b", 0.5, 9.0, "e2"),  # its client hung up at 1.5
        entry("c", 2.0, 3.0, "e2"),
    ]
    hung = shot("b", hung_up_at=1.5, outcome="hung_up")
    inflight([hung], entries, {("e1", 0): 1.0}, 1, 0.0, v)
    assert v.counts["inflight_over_limit"] == 1  # only "b" over "a", from 0.5 to 1.0
    assert not v.problems
    v2 = Verdict("p")
    inflight([], [entry("x", 0.0, None, "e9")], {}, 1, 0.0, v2)
    assert v2.problems  # an entry of a live engine that never ended


# -- priority ------------------------------------------------------------------------------------


def timed(rid: str, tenant: Any, a: float, d: float, seq: int, gateway: str = "gw") -> Shot:
    return shot(rid, tenant=tenant, timing=(a, d, seq, 1), sent_at=a, head_at=d, gateway=gateway)


def test_priority_counts_a_batch_request_dispatched_ahead_of_a_queued_interactive_one() -> None:
    v = Verdict("p")
    shots = [
        timed("i", INTERACTIVE, 1.0, 5.0, 1),
        timed("b-ahead", BATCH, 2.0, 3.0, 2),  # arrived while "i" waited, went first
        timed("b-after", BATCH, 2.5, 6.0, 3),  # arrived while "i" waited, went after
        timed("b-later", BATCH, 7.0, 7.0, 4),  # "i" was gone by then
        timed("b-other", BATCH, 2.0, 2.0, 1, gateway="other"),  # another gateway's queue
    ]
    priority(shots, v)
    assert v.counts["priority_inversions"] == 1
    assert "2 batch requests arrived while an interactive one was queued" in v.details[0]
    assert "b-ahead (seq 2," in v.details[0] and "ahead of i (seq 1," in v.details[0]


def test_priority_leaves_out_same_instant_dispatches_and_flags_a_foreign_clock() -> None:
    v = Verdict("p")
    priority([timed("i", INTERACTIVE, 1.0, 5.0, 1), timed("b", BATCH, 2.0, 5.0, 2)], v)
    assert v.counts["priority_inversions"] == 0 and "1 at the same instant" in v.details[0]
    bad = timed("i", INTERACTIVE, 1.0, 5.0, 1)
    bad.head_at = 4.0  # the response head before the dispatch: not one clock
    v2 = Verdict("p")
    priority([bad], v2)
    assert v2.problems
    v3 = Verdict("p")
    priority([shot("untimed", status=200)], v3)  # a 200 without the header: nothing checked
    assert v3.problems


# -- settlement ----------------------------------------------------------------------------------


def test_settlement_is_exact_where_the_client_knows_and_bounded_where_it_hung_up() -> None:
    p = gateway_prompt_tokens(0)
    done = shot("done", usage=(p, 10))
    failed = shot("failed", code="upstream_error", chunks=3)  # a stream cut by a dead engine
    refused = shot("refused", status=429, code="rate_limited", stream=False)
    hung = shot("hung", outcome="hung_up", chunks=2)  # at an engine that handed out 6
    queued = shot("queued", outcome="hung_up")  # never reached an engine
    for s in (done, failed):
        s.status = 200
    entries = [
        entry("done", 0, 1, prompt=p, state="finished", prefilled=p, generated=10, taken=10),
        entry("failed", 0, None, prompt=p),
        entry("hung", 0, 1, prompt=p, state="aborted", prefilled=p, generated=8, taken=6),
    ]
    exact = (p + 10) + (p + 3)
    lo, hi = exact + p + 2, exact + p + 6 + p
    for settled, off in ((lo, 0), (hi, 0), (lo - 1, 1), (hi + 4, 4)):
        v = Verdict("p")
        settlement([done, failed, refused, hung, queued], entries, settled, [], v)
        assert v.counts["settle_mismatch"] == off, (settled, v.details)


def test_settlement_compares_usage_prompts_and_engine_counters_with_the_journals() -> None:
    p = gateway_prompt_tokens(1)
    s = shot("s", usage=(p, 10), status=200, prompt=1)
    wrong = [entry("s", 0, 1, prompt=p + 1, state="finished", prefilled=p, generated=9)]
    v = Verdict("p")
    settlement([s], wrong, p + 10, [("e#0", p + 9 + 2, p, 9)], v)
    # generated 9 vs usage 10: 1; the engine's prompt count 1 off: 1; /metrics 2 off: 2
    assert v.counts["settle_mismatch"] == 4


# -- outcomes and statuses -----------------------------------------------------------------------


def test_outcomes_count_unended_requests_work_left_and_missing_or_extra_outcomes() -> None:
    shots = [shot("a", status=200), shot("b", outcome="broken"), shot("c", outcome="hung_up")]
    v = Verdict("p")
    outcomes(shots, 3, {"gw": 0}, v)
    assert v.counts["unfinished"] == 1  # "b"
    v = Verdict("p")
    outcomes(shots, 0, {"gw": 2}, v)  # "a" was answered without an outcome; 2 left
    assert v.counts["unfinished"] == 1 + 2 + 1
    v = Verdict("p")
    outcomes(shots, 5, {}, v)  # two outcomes more than requests sent
    assert v.counts["unfinished"] == 1 + 2


def test_statuses_count_500s_and_internal_errors_mid_stream_only() -> None:
    v = Verdict("p")
    shots = [
        shot("a", status=500, code="internal_error"),
        shot("b", status=200, code="internal_error"),
        shot("c", status=502, code="upstream_error"),
        shot("d", status=503, code="draining"),
    ]
    statuses(shots, v)
    assert v.counts["status_500"] == 2
    assert "502/upstream_error=1" in v.details[0] and "200+event/internal_error=1" in v.details[0]


def test_the_ledger_equals_the_settled_tokens() -> None:
    v = Verdict("fail_open")
    ledger({"requests": 3, "input": 40, "output": 60}, 100.0, v)
    assert v.counts["ledger_mismatch"] == 0 and "off by 0" in v.details[-1]
    ledger({"requests": 3, "input": 40, "output": 59}, 100.0, v)  # one token lost
    assert v.counts["ledger_mismatch"] == 1
    v = Verdict("fail_open")
    ledger(None, 130.0, v)  # Redis restarted empty: said, not counted
    assert v.ok and "not checked" in v.details[-1]


def test_the_verdict_line_and_its_exit_status() -> None:
    v = Verdict("fail_open", requests=7)
    assert v.ok
    assert v.line() == (
        "chaos: policy=fail_open requests=7 status_500=0 unfinished=0 leaked_slots=0 "
        "unsettled_reservations=0 settle_mismatch=0 inflight_over_limit=0 priority_inversions=0 "
        "ledger_mismatch=0"
    )
    v.problems.append("a check could not be made")
    assert not v.ok


# -- state ---------------------------------------------------------------------------------------


def test_redis_view_levels_refill_and_leases() -> None:
    capped = TENANTS[3]
    rate = capped.tokens_per_minute / 60.0
    key = f"ns:{{t:{capped.name}}}:b:{capped.bucket}"
    view = RedisView(now_ms=10_000, buckets={key: (-100.0, 9.0)})
    level, cap, r = view.bucket_levels()[key]
    assert (level, cap, r) == (-100.0 + rate, capped.token_burst, rate)
    assert view.seconds_to_full() == (cap - level) / rate
    view.leases = {"ns:{pool:default}:leases": {"live": 10_001.0, "stale": 10_000.0}}
    assert view.live_leases == [("ns:{pool:default}:leases", "live", 10_001.0)]
    assert view.stale_leases == 1


def test_metric_sum_matches_names_and_labels() -> None:
    text = 'a_total{t="x"} 2\na_total{t="y"} 3\na_total_more 9\n# a_total 100\n'
    assert metric_sum(text, "a_total") == 5
    assert metric_sum(text, "a_total", t="y") == 3


def test_state_context_says_what_each_gateway_held_just_before() -> None:
    st = {"breaker": "closed", "leases": {"default": 6}, "local_leases": {}, "fallbacks": {}}
    opened = {
        "breaker": "open",
        "leases": {"default": 2},
        "local_leases": {"default": 4},
        "fallbacks": {"lease_local": 4, "reserve_local": 3},
    }
    samples = [
        (9.0, "gw-a#0", st),
        (9.8, "gw-a#0", opened),
        (10.5, "gw-a#0", st),
        (9.9, "gw-b#0", st),
    ]
    got = state_context(samples, 10.0, 0.0)
    assert got == (
        "gw-a#0 at 9.80s: breaker open, leases {'default': 2}, local {'default': 4}, "
        "fallbacks +7 in the second before; gw-b#0 at 9.90s: breaker closed, leases "
        "{'default': 6}, local {}, fallbacks +0 in the second before"
    )
