"""The engines' prefill backlog and the replica choice it drives
(velvetrope.core.prefill_backlog, velvetrope.core.routing.least_loaded's ``ahead``)."""

from __future__ import annotations

import random

import pytest

from velvetrope.core import EngineSaturation, Job, least_loaded
from velvetrope.core.prefill_backlog import PrefillBacklog

from .helpers import make_job

TIMED = ("interactive", "standard")


def job(tier: str, band: int, prompt: int, streamed: bool = True) -> Job:
    """A job of ``tier`` in ``band`` (as the scheduler numbers them: 0 = the top)."""
    j = make_job(tier=tier, prompt=prompt, streamed=streamed)
    j.band = band
    return j


def test_a_prompt_waits_where_it_was_sent_until_its_first_token_or_its_end() -> None:
    b = PrefillBacklog(ordered=True, timed=TIMED)
    top = job("interactive", 0, 7000)
    probe = job("interactive", 0, 10)
    b.started(top)
    assert b.tokens("e0") == 0  # dispatched, not sent anywhere yet
    b.sent(top.id, "e0")
    assert (b.tokens("e0"), b.ahead("e0", probe), b.ahead("e1", probe)) == (7000, 7000, 0)
    b.sent(top.id, "e1")  # a retry elsewhere: it moves
    assert (b.tokens("e0"), b.tokens("e1")) == (0, 7000)
    b.prefilled(top.id, 1.0)
    assert b.tokens("e1") == 0
    b.ended(top.id)  # its end after its first token takes nothing off twice
    assert b.tokens("e1") == 0
    gone = job("standard", 1, 500)
    b.started(gone)
    b.sent(gone.id, "e0")
    b.ended(gone.id)  # ended with no first token (failed, cancelled, client gone)
    assert b.tokens("e0") == 0
    b.sent(gone.id, "e0")  # an event for a job no longer held changes nothing
    b.prefilled(gone.id, 2.0)
    assert b.tokens("e0") == 0


def test_the_backlog_takes_its_tokens_over_the_engines_measured_prefill_rate() -> None:
    """Little's law on the gateway's own streams: 4,000 tokens prefilled at e0 over its
    first 2 s (2,000 a second), 6,000 waiting there: 3 s; an engine that has prefilled
    nothing yet, or has nothing waiting, takes 0 (unknown is not busy)."""
    b = PrefillBacklog(ordered=True, timed=TIMED, window_s=5.0)
    done = [job("batch", 2, 1000) for _ in range(4)]
    waiting = [job("interactive", 0, 3000) for _ in range(2)]
    for j in (*done, *waiting):
        b.started(j)
        b.sent(j.id, "e0")
    cold = job("standard", 1, 500)
    b.started(cold)
    b.sent(cold.id, "e1")
    assert b.prefill_s("e0", 0.0) == 0.0  # nothing prefilled yet: no rate
    for t, j in zip((0.5, 1.0, 1.5, 2.0), done, strict=True):
        b.prefilled(j.id, t)
    assert b.tokens("e0") == 6000
    assert b.prefill_s("e0", 2.0) == pytest.approx(6000 / (4000 / 1.5))  # 1.5 s since the first
    assert b.prefill_s("e0", 2.5) == pytest.approx(3.0)
    assert b.prefill_s("e1", 2.5) == 0.0  # e1 has prefilled nothing
    assert b.prefill_s("e2", 2.5) == 0.0  # never sent anything
    for j in waiting:
        b.ended(j.id)
    assert b.prefill_s("e0", 2.5) == 0.0  # nothing waits


def test_with_the_tier_as_priority_only_the_bands_above_are_ahead() -> None:
    b = PrefillBacklog(ordered=True, timed=TIMED)
    for tier, band, prompt in (("interactive", 0, 100), ("standard", 1, 2000), ("batch", 2, 30000)):
        j = job(tier, band, prompt)
        b.started(j)
        b.sent(j.id, "e0")
    assert b.ahead("e0", job("interactive", 0, 1)) == 100
    assert b.ahead("e0", job("standard", 1, 1)) == 2100
    assert b.ahead("e0", job("batch", 2, 1)) == 0  # no TTFT objective: the load decides
    assert b.tokens("e0") == 32100
    fcfs = PrefillBacklog(ordered=False, timed=TIMED)  # a first-come engine: all are ahead
    j = job("batch", 2, 30000)
    fcfs.started(j)
    fcfs.sent(j.id, "e0")
    assert fcfs.ahead("e0", job("interactive", 0, 1)) == 30000


def test_a_response_not_streamed_is_not_counted() -> None:
    b = PrefillBacklog(ordered=True, timed=TIMED)
    j = job("interactive", 0, 5000, streamed=False)
    b.started(j)
    b.sent(j.id, "e0")
    assert b.tokens("e0") == 0


def test_random_event_orders_leave_nothing_behind() -> None:
    """Whatever order the events come in (retries, first tokens, ends), once every job has
    ended every engine's backlog is exactly 0, and before that it is the sum of the
    prompts sent there with no first token yet."""
    rng = random.Random(5)
    b = PrefillBacklog(ordered=True, timed=TIMED)
    live: dict[str, tuple[int, str | None, bool]] = {}
    jobs = {}
    for step in range(3000):
        op = rng.random()
        if op < 0.3 or not live:
            j = job("interactive", rng.randrange(3), rng.randrange(1, 9000))
            jobs[j.id] = j
            b.started(j)
            live[j.id] = (j.prompt_tokens, None, False)
        else:
            jid = rng.choice(sorted(live))
            prompt, where, done = live[jid]
            if op < 0.6:
                e = f"e{rng.randrange(3)}"
                b.sent(jid, e)
                if not done:
                    live[jid] = (prompt, e, False)
            elif op < 0.8:
                b.prefilled(jid, step * 0.01)
                live[jid] = (prompt, where, True)
            else:
                b.ended(jid)
                del live[jid]
        if step % 97 == 0:
            for e in ("e0", "e1", "e2"):
                want = sum(p for p, w, done in live.values() if w == e and not done)
                assert b.tokens(e) == want
    for jid in list(live):
        b.ended(jid)
    assert [b.tokens(e) for e in ("e0", "e1", "e2")] == [0, 0, 0]


def test_the_least_prefill_ahead_wins_then_the_load() -> None:
    assert least_loaded([5, 1], ahead=[0, 7000]) == 0  # fewer in flight, but a long prefill
    assert least_loaded([5, 1], ahead=[0, 0]) == 1  # no backlog either side: the load
    assert least_loaded([5, 1, 1], ahead=[9, 9, 9], start=2) == 2  # ties: from start
    assert least_loaded([5, 1], eligible=lambda i: i == 1, ahead=[0, 7000]) == 1


def test_the_saturation_rule_keeps_the_backlog_from_its_own_events() -> None:
    """The rule hears started / sent / first_token / ended from the controller and the
    caller: its :meth:`prefill_ahead` and status follow without another call."""
    rule = EngineSaturation("default")
    rule.backlog = PrefillBacklog(ordered=True, timed=TIMED)
    rule.set_engines(["e0", "e1"])
    long, short = job("interactive", 0, 6000), job("interactive", 0, 20)
    for j, e in ((long, "e0"), (short, "e1")):
        rule.started(j, 0.0)
        rule.sent(j.id, e)
    nxt = job("interactive", 0, 50)
    assert (rule.prefill_ahead("e0", nxt), rule.prefill_ahead("e1", nxt)) == (6000, 20)
    assert rule.status(0.0)["e0"]["prefill_backlog_tokens"] == 6000
    rule.first_token(long, 0.5)
    assert rule.prefill_ahead("e0", nxt) == 0
    rule.ended(short, 0.6)
    assert rule.status(0.6)["e1"]["prefill_backlog_tokens"] == 0
    assert EngineSaturation("bare").prefill_ahead("e0", nxt) == 0  # no backlog kept
