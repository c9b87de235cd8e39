"""The real-time driver, on a ManualClock with a sleep that advances it: no wall clock.

A reference run steps a second Batcher in pure virtual time; the driver must reproduce its
model times exactly, deliver every event at ``w0 + model_time / speed`` on the clock, catch
up without sleeping when it falls behind, re-anchor when idle or too far behind, and free a
sequence's KV blocks the moment it is aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from velvetrope.clock import ManualClock
from velvetrope.engine.batcher import Batcher, Finished, FirstToken
from velvetrope.engine.profile import EngineProfile, load_profile
from velvetrope.engine.serve.engine_request import EngineClosed, EngineRequest
from velvetrope.engine.serve.realtime import RealtimeEngine
from velvetrope.errors import PolicyError

START = 1000.0


def profile(**overrides: float | int | str) -> EngineProfile:
    return load_profile("llama3-8b-h100").with_overrides(**overrides)


@dataclass
class FakeTime:
    """A ManualClock and a sleep that advances it (plus an optional one-off oversleep)."""

    clock: ManualClock = field(default_factory=lambda: ManualClock(START))
    sleeps: list[float] = field(default_factory=list)
    oversleep: list[float] = field(default_factory=list)  # extra seconds, consumed in order
    yields: int = 1  # loop iterations a sleep lets other tasks run

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        if delay > 0:
            extra = self.oversleep.pop(0) if self.oversleep else 0.0
            self.clock.advance(delay + extra)
        for _ in range(self.yields):
            await asyncio.sleep(0)


def reference(
    prof: EngineProfile, seqs: list[tuple[str, int, int]]
) -> dict[str, tuple[float, float]]:
    """(first token, finish) model times of ``seqs`` all arriving at 0, in pure virtual time."""
    b = Batcher(prof)
    for seq_id, p, o in seqs:
        b.add(seq_id, p, o, 0.0)
    first: dict[str, float] = {}
    out: dict[str, tuple[float, float]] = {}
    t = 0.0
    while b.has_work:
        res = b.step(t)
        t = res.end
        for ev in res.events:
            if isinstance(ev, FirstToken):
                first[ev.seq_id] = ev.t
            elif isinstance(ev, Finished):
                out[ev.seq_id] = (first[ev.seq_id], ev.t)
    return out


async def drain(r: EngineRequest) -> int:
    total = 0
    while n := await r.next_tokens():
        total += n
    return total


def run(
    body: Callable[[RealtimeEngine, FakeTime], Awaitable[None]],
    prof: EngineProfile | None = None,
    *,
    speed: float = 1.0,
    fake: FakeTime | None = None,
    **kw: object,
) -> RealtimeEngine:
    """Run ``body`` against a started engine and stop it afterwards."""
    fake = fake or FakeTime()
    eng = RealtimeEngine(
        Batcher(prof or profile()),
        speed=speed,
        clock=fake.clock,
        sleep=fake.sleep,
        **kw,  # type: ignore[arg-type]
    )

    async def main() -> None:
        await eng.start()
        try:
            await asyncio.wait_for(body(eng, fake), timeout=30)
        finally:
            await eng.stop()

    asyncio.run(main())
    return eng


@pytest.mark.parametrize("speed", [1.0, 4.0, 250.0])
def test_one_request_reproduces_the_model_and_lands_on_the_timeline(speed: float) -> None:
    prof = profile()
    (ref_first, ref_finish) = reference(prof, [("a", 700, 40)])["a"]
    got: dict[str, EngineRequest] = {}
    fake = FakeTime()

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        r = eng.submit("a", 700, 40)
        got["a"] = r
        assert await drain(r) == 40
        assert r.finished

    run(body, prof, speed=speed, fake=fake)
    r = got["a"]
    assert r.arrival_model == 0.0
    assert r.model_queue_s == 0.0
    assert r.model_ttft_s == pytest.approx(ref_first)
    assert r.model_e2e_s == pytest.approx(ref_finish)
    # Wall times follow the absolute timeline exactly: START + model / speed.
    assert r.arrival_wall == START
    assert r.scheduled_wall == START
    assert r.first_token_wall == pytest.approx(START + ref_first / speed)
    assert r.finished_wall == pytest.approx(START + ref_finish / speed)
    assert all(d >= 0 for d in fake.sleeps)
    assert sum(fake.sleeps) == pytest.approx(ref_finish / speed)


def test_counters_follow_the_tokens() -> None:
    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        a = eng.submit("a", 100, 5)
        b = eng.submit("b", 300, 7)
        assert await drain(a) + await drain(b) == 12

    eng = run(body)
    assert eng.prompt_tokens_total == 400
    assert eng.generation_tokens_total == 12
    assert eng.num_running == eng.num_waiting == eng.num_requests == 0
    assert eng.kv_usage == 0.0


def test_queue_time_is_time_until_first_scheduled() -> None:
    prof = profile(max_num_seqs=1)
    got: list[EngineRequest] = []

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        got.extend([eng.submit("a", 200, 10), eng.submit("b", 200, 10)])
        await drain(got[0])
        await drain(got[1])

    run(body, prof, speed=10.0)
    a, b = got
    assert a.model_queue_s == 0.0
    assert b.model_queue_s == pytest.approx(a.model_e2e_s)  # b starts when a is done
    assert b.scheduled_wall == pytest.approx(a.finished_wall)
    assert b.model_ttft_s is not None and b.model_queue_s is not None
    assert b.model_ttft_s > b.model_queue_s


def test_falling_behind_catches_up_without_sleeping_and_keeps_the_timeline() -> None:
    prof = profile()
    (ref_first, ref_finish) = reference(prof, [("a", 50, 60)])["a"]
    step = prof.step_time(0, 1, 100)  # ~one decode step
    fake = FakeTime(oversleep=[5 * step])  # the first sleep overshoots by ~5 steps
    got: list[EngineRequest] = []

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        got.append(eng.submit("a", 50, 60))
        await drain(got[0])

    eng = run(body, prof, fake=fake)
    r = got[0]
    # The model's own times are untouched by the hiccup...
    assert r.model_ttft_s == pytest.approx(ref_first)
    assert r.model_e2e_s == pytest.approx(ref_finish)
    # ...the first token was late, but the driver then did not sleep until caught up...
    assert r.first_token_wall == pytest.approx(START + ref_first + 5 * step)
    assert fake.sleeps[1:4] == [0, 0, 0]
    # ...and the last token is back on the timeline: no drift accumulated.
    assert r.finished_wall == pytest.approx(START + ref_finish)
    assert eng.resyncs == 0
    assert 3 * step < eng.max_lag_seen_s <= 5 * step


def test_a_lag_beyond_max_lag_re_anchors_the_timeline() -> None:
    prof = profile()
    (ref_first, ref_finish) = reference(prof, [("a", 50, 60)])["a"]
    fake = FakeTime(oversleep=[0.5])
    got: list[EngineRequest] = []

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        got.append(eng.submit("a", 50, 60))
        await drain(got[0])

    eng = run(body, prof, fake=fake, max_lag_s=0.1)
    r = got[0]
    assert eng.resyncs == 1
    assert r.model_e2e_s == pytest.approx(ref_finish)
    # Everything after the hiccup is shifted by it instead of being rushed through.
    assert r.first_token_wall is not None and r.finished_wall is not None
    assert r.finished_wall - r.first_token_wall == pytest.approx(ref_finish - ref_first)


def test_idle_time_passes_at_speed_and_model_time_never_goes_back() -> None:
    speed = 20.0
    got: list[EngineRequest] = []

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        got.append(eng.submit("a", 100, 10))
        await drain(got[0])
        fake.clock.advance(3.0)  # idle for 3 wall seconds
        got.append(eng.submit("b", 100, 10))
        await drain(got[1])

    run(body, speed=speed)
    a, b = got
    assert a.finished_model is not None and a.finished_wall is not None
    assert b.arrival_model == pytest.approx(a.finished_model + 3.0 * speed)
    assert b.arrival_wall == pytest.approx(a.finished_wall + 3.0)
    assert b.model_e2e_s == pytest.approx(a.model_e2e_s)  # same work, same model time


def test_idle_resync_forgets_a_lag() -> None:
    fake = FakeTime(oversleep=[0.05])  # the first request's only step is delivered 50 ms late
    got: list[EngineRequest] = []

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        got.append(eng.submit("a", 100, 1))
        await drain(got[0])
        got.append(eng.submit("b", 100, 1))  # arrives right after, while idle
        await drain(got[1])

    run(body, fake=fake)
    a, b = got
    assert a.finished_model is not None and a.finished_wall is not None
    assert a.finished_wall == pytest.approx(START + a.finished_model + 0.05)
    assert b.arrival_wall == a.finished_wall
    assert b.arrival_model == pytest.approx(a.finished_model + 0.05)  # the lag became idle time
    assert b.first_token_wall == pytest.approx(b.arrival_wall + (b.model_ttft_s or -1))


def test_arrival_is_stamped_when_the_request_reached_the_server() -> None:
    speed = 2.0
    got: list[EngineRequest] = []

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        got.append(eng.submit("a", 100, 50))
        assert await got[0].next_tokens() >= 1
        now = fake.clock.now()
        got.append(eng.submit("b", 100, 5, arrived_at=now - 0.001))
        assert got[1].arrival_wall == now - 0.001
        assert got[1].arrival_model == pytest.approx(eng.model_now() - 0.001 * speed)
        await drain(got[1])
        await drain(got[0])

    run(body, speed=speed)


def test_arrival_while_busy_never_lands_after_the_next_step_start() -> None:
    got: list[EngineRequest] = []
    fake = FakeTime()

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        got.append(eng.submit("a", 100, 50))
        assert await got[0].next_tokens() >= 1
        fake.clock.advance(0.2)  # the loop was stuck: the next step is long overdue
        got.append(eng.submit("b", 100, 5))
        await drain(got[1])
        await drain(got[0])

    run(body, fake=fake)
    a, b = got
    assert a.first_token_model is not None
    assert b.arrival_model < b.arrival_wall - START  # clamped to the next step's start
    assert b.model_queue_s == 0.0


def test_first_token_consumers_are_woken_before_decoding_ones() -> None:
    # A 50-token budget chunks b's 100-token prefill over steps 1-3 while a (10 tokens)
    # decodes; in step 3 a's token comes first in the batcher's events, b's first token last.
    prof = profile(max_num_batched_tokens=50, max_num_seqs=8)
    order: list[str] = []

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        a = eng.submit("a", 10, 30)
        b = eng.submit("b", 100, 30)
        assert await a.next_tokens() == 1  # step 1: a's first token
        assert await a.next_tokens() == 1  # step 2: a decodes, b still prefilling
        assert b.first_token_model is None

        async def consume(r: EngineRequest) -> None:
            await r.next_tokens()
            order.append(r.seq_id)

        await asyncio.gather(consume(a), consume(b))  # both served by step 3
        assert a.tokens_delivered == 3 and b.tokens_delivered == 1
        eng.abort(a)
        eng.abort(b)

    run(body, prof, fake=FakeTime(yields=5))  # consumers get to wait before each delivery
    assert order == ["b", "a"]


def test_abort_frees_the_blocks_at_once() -> None:
    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        r = eng.submit("a", 1000, 500)
        assert await r.next_tokens() >= 1
        assert eng.batcher.used_blocks > 0
        assert eng.abort(r)
        assert eng.batcher.used_blocks == 0
        assert eng.num_running == 0 and eng.kv_usage == 0.0
        assert await r.next_tokens() == 0
        assert r.state == "aborted"
        assert not eng.abort(r)

    run(body)


def test_abort_before_the_first_token() -> None:
    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        r = eng.submit("a", 1000, 5)
        eng.abort(r)
        assert await r.next_tokens() == 0
        assert r.first_token_model is None
        await asyncio.sleep(0)
        assert eng.batcher.used_blocks == 0

    run(body)


def test_on_finish_sees_every_completed_request() -> None:
    done: list[str] = []

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        rs = [eng.submit(f"s{i}", 50, 3 + i) for i in range(4)]
        eng.abort(rs[0])
        for r in rs:
            await drain(r)

    run(body, on_finish=lambda r: done.append(r.seq_id))
    assert sorted(done) == ["s1", "s2", "s3"]


def test_stop_closes_live_requests_and_refuses_new_ones() -> None:
    fake = FakeTime()
    prof = profile()
    eng = RealtimeEngine(Batcher(prof), clock=fake.clock, sleep=fake.sleep)

    async def main() -> None:
        with pytest.raises(EngineClosed):
            eng.submit("early", 10, 1)
        await eng.start()
        r = eng.submit("a", 100, 1000)
        assert await r.next_tokens() >= 1
        await eng.stop()
        with pytest.raises(EngineClosed):
            await r.next_tokens()
        assert r.state == "closed"
        with pytest.raises(EngineClosed):
            eng.submit("b", 10, 1)
        assert eng.batcher.used_blocks == 0
        await eng.stop()  # idempotent

    asyncio.run(main())


def test_batcher_refusals_surface_as_policy_errors() -> None:
    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        with pytest.raises(PolicyError):
            eng.submit("long", 8000, 500)
        eng.submit("a", 10, 1)
        with pytest.raises(PolicyError):
            eng.submit("a", 10, 1)

    run(body)


def test_priority_mode_stamps_out_of_order_admissions() -> None:
    prof = profile(max_num_seqs=1)
    got: dict[str, EngineRequest] = {}
    fake = FakeTime()
    eng = RealtimeEngine(
        Batcher(prof, priority=True), clock=fake.clock, sleep=fake.sleep, priority=True
    )

    async def main() -> None:
        await eng.start()
        try:
            got["mid"] = eng.submit("mid", 100, 5, priority=5)
            got["low"] = eng.submit("low", 100, 5, priority=9)
            got["high"] = eng.submit("high", 100, 5, priority=0)
            for r in got.values():
                await drain(r)
        finally:
            await eng.stop()

    asyncio.run(main())
    mid, low, high = got["mid"], got["low"], got["high"]
    assert high.model_queue_s == 0.0
    assert mid.model_queue_s == pytest.approx(high.model_e2e_s)
    assert low.model_queue_s == pytest.approx((mid.finished_model or -1) - low.arrival_model)
    assert high.scheduled_wall == START


def test_speed_must_be_positive_and_finite() -> None:
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="speed"):
            RealtimeEngine(Batcher(profile()), speed=bad)


def test_speculative_steps_deliver_several_tokens_and_count_the_drafts() -> None:
    prof = profile().with_overrides(spec_tokens=3, spec_acceptance=1.0)

    async def body(eng: RealtimeEngine, fake: FakeTime) -> None:
        r = eng.submit("a", 100, 9)
        chunks = []
        while n := await r.next_tokens():
            chunks.append(n)
        assert sum(chunks) == 9
        assert max(chunks) == 4  # a verification step: 3 accepted drafts plus one

    eng = run(body, prof)
    assert eng.generation_tokens_total == 9
    assert (eng.spec_draft_tokens, eng.spec_accepted_tokens) == (6, 6)
