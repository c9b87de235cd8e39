"""The engine-saturation rule in the core, on a ManualClock (velvetrope.core.saturation).

The gateway's part (which engine took a job, which engines are live, what a scrape said)
is played by the tests, exactly as :mod:`velvetrope.gateway.upstream.engines` does it;
one test drives the rule with a real engine model (:class:`~velvetrope.engine.Batcher`)
in virtual time.
"""

from __future__ import annotations

import heapq
import random
from typing import Any

import pytest

from tests.core.helpers import make_job
from velvetrope.clock import ManualClock
from velvetrope.core import (
    AdmissionController,
    Dispatched,
    EngineReading,
    EngineSaturation,
    Job,
    PolicyConfig,
    Queued,
    Reason,
    Usage,
    least_loaded,
)
from velvetrope.engine import Batcher, Finished, load_profile


def reading(held: int, max_num_seqs: int = 2, kv: float = 0.1) -> EngineReading:
    """What an engine running at most ``max_num_seqs`` reports while holding ``held``."""
    running = min(held, max_num_seqs)
    return EngineReading(running=running, waiting=held - running, kv_usage=kv)


class Gateway:
    """The core with its saturation rule, and the gateway's bookkeeping played by hand:
    engines by name, which of them are live, and who holds which job."""

    def __init__(self, engines: list[str], max_waiting: int = 0, **sat: Any) -> None:
        self.clock = ManualClock()
        cfg = {
            "pools": [{"name": "default", "max_in_flight": 64}],
            "saturation": {"max_waiting": max_waiting, **sat},
        }
        self.ctl = AdmissionController(PolicyConfig.model_validate(cfg), self.clock)
        sat_rule = self.ctl.saturation("default")
        assert sat_rule is not None
        self.sat: EngineSaturation = sat_rule
        self.engines = engines
        self.live = list(engines)
        self.sat.set_engines(self.live)
        self.held: dict[str, list[Job]] = {e: [] for e in engines}
        self.n = 0
        self.no_upstream = 0
        self.jobs: list[Job] = []

    def set_live(self, live: list[str]) -> None:
        self.live = live
        self.sat.set_engines(live)

    def scrape(self, engine: str) -> None:
        self.sat.observe(engine, reading(len(self.held[engine])), self.clock.now())

    def _send(self, job: Job) -> None:
        """Dispatched: to the least-loaded live engine, or 503 no_healthy_upstream."""
        loads = [len(self.held[e]) for e in self.live]
        k = least_loaded(loads)
        if k < 0:
            self.no_upstream += 1
            self.ctl.fail(job.id, Reason.NO_HEALTHY_UPSTREAM)
            return
        self.sat.sent(job.id, self.live[k])
        self.held[self.live[k]].append(job)

    def arrive(self, count: int = 1) -> list[Job]:
        """``count`` arrivals; returns the jobs dispatched now (sent or failed)."""
        out = []
        for _ in range(count):
            self.n += 1
            job = Job(f"j{self.n}", "t", "default", prompt_tokens=5, max_tokens=10)
            self.jobs.append(job)
            d = self.ctl.arrive(job)
            if isinstance(d, Dispatched):
                out.append(job)
                self._send(job)
            else:
                assert isinstance(d, Queued)
        return out

    def pump(self) -> list[Job]:
        out = self.ctl.dispatchable()
        for job in out:
            self._send(job)
        return out

    def complete(self, engine: str, count: int | None = None) -> None:
        jobs = self.held[engine][: count if count is not None else None]
        for job in jobs:
            self.held[engine].remove(job)
            self.ctl.complete(job.id, Usage(5, 10))

    def concurrent_after_burst(self, size: int) -> int:
        """A burst of ``size`` arrivals: how many reach the engines at once."""
        before = sum(len(h) for h in self.held.values())
        self.arrive(size)
        self.pump()
        return sum(len(h) for h in self.held.values()) - before

    def drain(self) -> None:
        while self.ctl.in_flight or self.ctl.queued:
            for e in self.engines:
                self.complete(e)
                self.scrape(e)
            self.pump()


def test_an_engine_seen_queueing_holds_dispatch_until_it_has_room() -> None:
    gw = Gateway(["e"], initial_capacity=4)
    assert len(gw.arrive(4)) == 4  # never read: taken as idle, trusted with its window
    assert gw.arrive(1) == [] and gw.ctl.queued == 1  # ... and no more
    gw.scrape("e")  # it runs 2 and queues our other 2: capacity 2 learned
    assert gw.arrive(1) == [] and gw.ctl.queued == 2 and gw.sat.holds == 1
    gw.complete("e", 2)  # by the reading corrected for the two that came back: full
    assert gw.pump() == []
    gw.complete("e", 1)  # room for exactly one
    assert len(gw.pump()) == 1 and gw.ctl.queued == 1
    assert gw.sat.pending == 0 and gw.sat.ours("e") == 2
    assert gw.pump() == []


def test_an_engine_running_all_it_was_allowed_is_probed_with_one_more() -> None:
    gw = Gateway(["e"], initial_capacity=3)
    gw.arrive(3)
    gw.scrape("e")  # runs 2, queues 1: capacity 2
    gw.complete("e", 1)
    gw.arrive(3)
    assert gw.ctl.queued == 3
    gw.scrape("e")  # runs the 2 it was allowed, nothing queued: perhaps it runs more
    assert len(gw.pump()) == 1 and gw.ctl.queued == 2
    gw.scrape("e")  # it does not: the third waits in the engine, capacity back to 2
    assert gw.pump() == [] and gw.sat.status(gw.clock.now())["e"]["capacity"] == 2
    big = Gateway(["e"], initial_capacity=3)
    big.arrive(3)
    big.scrape("e")
    big.complete("e", 1)
    big.sat.observe("e", reading(2, max_num_seqs=8, kv=0.99), 0.0)  # KV full: no probe
    big.arrive(1)
    assert big.ctl.queued == 1


@pytest.mark.parametrize("max_waiting", [0, 2])
def test_max_waiting_is_the_slack_per_engine(max_waiting: int) -> None:
    gw = Gateway(["e"], max_waiting=max_waiting, initial_capacity=3)
    gw.arrive(3)
    gw.scrape("e")  # runs 2, queues 1
    sent = len(gw.arrive(3))
    assert sent == max(0, 2 + max_waiting - 3)


def test_a_cold_start_is_held_from_the_first_request() -> None:
    """No learning period: the first burst meets a slow-start window of one request, which
    each reading that shows the engine running all of it doubles, until a reading shows the
    engine queueing; its queue never grows past the last doubling."""
    gw = Gateway(["e"])  # the engine runs 2 at once; max_waiting 0
    assert len(gw.arrive(10)) == 1 and gw.ctl.queued == 9
    gw.scrape("e")  # runs the one it was given: window 2
    assert len(gw.pump()) == 1
    gw.scrape("e")  # runs both: window 4
    assert len(gw.pump()) == 2 and gw.pump() == []
    gw.scrape("e")  # runs 2, queues 2: capacity 2 learned, held
    st = gw.sat.status(gw.clock.now())["e"]
    assert (st["capacity"], st["capacity_learned"], st["waiting"]) == (2, True, 2)
    assert gw.pump() == [] and gw.ctl.queued == 6
    gw.complete("e", 3)  # one left in the engine: room for one more than it had
    assert len(gw.pump()) == 1


def test_slow_start_doubles_to_a_large_engine_and_stops_at_its_first_queue() -> None:
    gw = Gateway(["e"], initial_capacity=2)
    gw.arrive(200)
    windows = []
    for _ in range(8):
        gw.sat.observe("e", reading(len(gw.held["e"]), max_num_seqs=24), gw.clock.now())
        gw.pump()
        windows.append(gw.sat.status(gw.clock.now())["e"]["capacity"])
    assert windows == [4, 8, 16, 32, 24, 24, 24, 24]  # 32 sent to an engine of 24: learned
    assert len(gw.held["e"]) == 32  # its queue peaked at 8, and holds there


def test_kv_full_holds_and_an_unreadable_engine_is_blind() -> None:
    gw = Gateway(["e"], max_waiting=4)
    gw.arrive(2)
    gw.sat.observe("e", reading(2, kv=0.99), gw.clock.now())
    assert gw.arrive(1) == []  # KV full: nothing more, whatever max_waiting says
    fresh = Gateway(["e"])
    fresh.sat.observe("e", None, 0.0)  # /metrics could not be read, ever
    assert fresh.sat.state("e", 0.0) == "blind"
    assert len(fresh.arrive(6)) == 6  # no saturation for it: only the in-flight limit
    fresh.scrape("e")  # a reading at last: it holds 6 and runs 2, saturation is back on
    assert fresh.sat.state("e", 0.0) == "on" and fresh.arrive(1) == []


def test_the_room_is_what_the_kv_cache_holds_at_the_lengths_running_now() -> None:
    """A capacity learned in requests does not outgrow the KV cache once the sequences it
    runs grow: the room is at most the requests the cache holds before ``max_kv_usage`` at
    what each running request holds on average, less those sent since the reading."""
    sat = EngineSaturation("p", max_waiting=0, max_kv_usage=0.9)
    sat.set_engines(["e"])
    sat.observe("e", EngineReading(running=40, waiting=1, kv_usage=0.4), 0.0)
    assert sat.engine_room("e", 0.0) == pytest.approx(-1.0)  # learned: 40 at once
    # 20 running hold 0.8 of the cache (0.04 each): room for 2.5 more, not 40 - 20
    sat.observe("e", EngineReading(running=20, waiting=0, kv_usage=0.8), 1.0)
    assert sat.engine_room("e", 1.0) == pytest.approx(2.5)
    for _ in range(2):
        job = make_job()
        assert sat.allows_dispatch(job, 0, 0, 1.0)
        sat.started(job, 1.0)
        sat.sent(job.id, "e")
    assert sat.engine_room("e", 1.0) == pytest.approx(0.5)  # the two sent take theirs
    assert not sat.allows_dispatch(make_job(), 0, 0, 1.0)
    # short sequences (0.01 each): the learned count is the tighter bound again
    sat.observe("e", EngineReading(running=20, waiting=0, kv_usage=0.2), 2.0)
    assert sat.engine_room("e", 2.0) == pytest.approx(20.0)


def test_engines_read_keep_their_limit_beside_a_blind_one() -> None:
    """A pool of an engine read (full) and one blind: the pool is not held, and the replica
    choice (has_room) sends the work to the blind one, not to the engine that is full."""
    gw = Gateway(["read", "blind"], initial_capacity=2)
    gw.sat.observe("blind", None, 0.0)
    gw.arrive(2)
    for job in list(gw.held["blind"]):  # put both on the engine that is read
        gw.held["blind"].remove(job)
        gw.held["read"].append(job)
        gw.sat.sent(job.id, "read")
    gw.scrape("read")  # runs 2, nothing queued, window doubled to 4 ...
    gw.arrive(2)  # (the harness's least-loaded choice sends these to the blind one)
    gw.sat.observe("read", reading(4), gw.clock.now())  # ... it queues 2: capacity 2
    now = gw.clock.now()
    assert gw.sat.room(now) == float("inf")
    assert not gw.sat.has_room("read", now) and gw.sat.has_room("blind", now)
    assert gw.sat.engine_room("read", now) == 2 - 4
    assert [gw.sat.state(e, now) for e in ("read", "blind")] == ["on", "blind"]


def test_the_hung_engine_episode_leaves_exact_accounting() -> None:
    """The issue's episode: one engine running 2, two long streams in flight, the engine
    hangs (health checks fail: it leaves the live set), 20 requests get 503
    no_healthy_upstream, the engine comes back.  Afterwards a burst reaches the engine
    exactly as before the episode."""
    gw = Gateway(["e"], initial_capacity=3)
    gw.arrive(3)
    gw.scrape("e")  # capacity 2 learned
    gw.drain()
    before = gw.concurrent_after_burst(40)
    gw.drain()
    assert before == 2
    gw.arrive(2)  # two long streams in flight
    gw.set_live([])  # SIGSTOP: the health check fails
    gw.arrive(20)  # dispatched (the rule has no live engine to judge), then 503
    assert gw.no_upstream == 20 and gw.sat.pending == 0
    gw.set_live(["e"])  # SIGCONT
    gw.complete("e")
    gw.scrape("e")
    after = gw.concurrent_after_burst(40)
    assert after == before
    gw.drain()
    assert (gw.sat.pending, gw.sat.ours("e"), gw.ctl.in_flight) == (0, 0, 0)


@pytest.mark.parametrize("seed", range(5))
def test_every_dispatch_is_counted_and_released_once(seed: int) -> None:
    """Random mixes of outcomes: completed, failed, cancelled before or after reaching an
    engine, retried on another engine; everything comes back to zero."""
    rng = random.Random(seed)
    gw = Gateway(["a", "b", "c"], max_waiting=1)
    dispatched: list[Job] = []
    for _step in range(400):
        gw.clock.advance(0.05)
        op = rng.random()
        if op < 0.35:
            dispatched += [j for j in gw.arrive(rng.randint(1, 3)) if j.state.value == "dispatched"]
        elif op < 0.45:
            gw.scrape(rng.choice(gw.engines))
        elif op < 0.5:
            gw.set_live(rng.sample(gw.engines, rng.randint(0, 3)))
        elif dispatched:
            job = dispatched.pop(rng.randrange(len(dispatched)))
            engine = next((e for e, h in gw.held.items() if job in h), None)
            if engine is not None:
                gw.held[engine].remove(job)
            end = rng.random()
            if end < 0.15 and engine is not None:  # retried elsewhere, stays in flight
                other = rng.choice(gw.engines)
                gw.sat.sent(job.id, other)
                gw.held[other].append(job)
                dispatched.append(job)
            elif end < 0.6:
                gw.ctl.complete(job.id, Usage(5, 10))
            elif end < 0.8:
                gw.ctl.fail(job.id, Reason.UPSTREAM_ERROR)
            else:
                gw.ctl.cancel(job.id)
        dispatched += [j for j in gw.pump() if j.state.value == "dispatched"]
        held_total = sum(len(h) for h in gw.held.values())
        assert gw.sat.pending == 0  # the bookkeeping sends at once
        assert sum(gw.sat.ours(e) for e in gw.engines) == held_total
    for job in gw.jobs:
        if not job.terminal:
            gw.ctl.cancel(job.id)
    assert gw.ctl.in_flight == 0
    assert gw.sat.pending == 0 and all(gw.sat.ours(e) == 0 for e in gw.engines)


def test_a_stale_reading_is_not_used_until_readings_return() -> None:
    """Never stuck: a reading older than stale_after_s holds nothing (the engine is served
    without saturation, the in-flight limit alone holds it), and the next reading holds
    again."""
    gw = Gateway(["e"], max_waiting=2, scrape_interval_s=1.0, initial_capacity=3)  # 3 s
    gw.arrive(3)
    gw.scrape("e")  # runs 2, queues 1: capacity 2, room 2 + 2 - 3 = 1
    gw.clock.advance(3.0)
    assert len(gw.arrive(2)) == 1  # 3 s old: still fresh, still holds
    assert gw.sat.state("e", gw.clock.now()) == "on"
    gw.clock.advance(0.5)
    assert gw.sat.state("e", gw.clock.now()) == "stale"
    assert len(gw.pump()) == 1 and len(gw.arrive(20)) == 20  # held by nothing but slots
    assert gw.ctl.in_flight == 25 and gw.sat.room(gw.clock.now()) == float("inf")
    gw.scrape("e")  # readings are back: 25 held, 2 running: nothing more
    assert gw.sat.state("e", gw.clock.now()) == "on" and gw.arrive(1) == []


def test_readings_that_stop_hold_until_stale_then_the_backlog_goes() -> None:
    """A real engine model (4 sequences at once) under 3x overload; the gateway reads it
    every second for 20 s, then the readings stop.  While it is read its waiting queue never
    exceeds max_waiting plus the dispatches of one scrape interval, and once the first flood
    has drained it stays within max_waiting; once the last reading is stale (23 s) the rule
    no longer holds the pool (not one job at a time forever): the gateway's backlog goes to
    the engine, and every later arrival is dispatched at once."""
    profile = load_profile("llama3-8b-h100").with_overrides(max_num_seqs=4)
    clock = ManualClock()
    cfg = {
        "pools": [{"name": "default", "max_in_flight": 1000}],
        "saturation": {"max_waiting": 1, "scrape_interval_s": 1.0},
    }
    ctl = AdmissionController(PolicyConfig.model_validate(cfg), clock)
    sat = ctl.saturation("default")
    assert sat is not None
    sat.set_engines(["e"])
    engine = Batcher(profile, token_events=False)
    events: list[tuple[float, int, str]] = [(i * 0.1, 1, "arrive") for i in range(400)]
    events += [(float(s), 0, "scrape") for s in range(1, 21)]  # 10/s in; ~3/s served
    heapq.heapify(events)
    step_end: float | None = None
    waiting: list[tuple[float, int]] = []  # the engine's queue after each step's scheduling
    sends: list[tuple[float, int, int]] = []  # (time, jobs sent, jobs it held before)
    n = most_queued = 0
    queued_after: list[tuple[float, int]] = []  # the gateway's queue after each arrival

    def send(jobs: list[Job]) -> None:
        nonlocal step_end
        if not jobs:
            return
        sends.append((clock.now(), len(jobs), engine.num_running + engine.num_waiting))
        for job in jobs:
            engine.add(job.id, 100, 200, clock.now())
            sat.sent(job.id, "e")
        if step_end is None:
            step_end = clock.now()

    while True:
        t_ev = events[0][0] if events else float("inf")
        if step_end is not None and step_end <= t_ev:
            clock.set(step_end)
            res = engine.step(step_end)
            waiting.append((step_end, engine.num_waiting))
            step_end = step_end + res.duration
            for e in res.events:
                if type(e) is Finished:
                    ctl.complete(e.seq_id, Usage(100, 200))
            if not engine.has_work:
                step_end = None
            send(ctl.dispatchable())
            continue
        if not events:
            break
        t, _, kind = heapq.heappop(events)
        clock.set(t)
        if kind == "scrape":
            r = EngineReading(engine.num_running, engine.num_waiting, engine.kv_usage)
            sat.observe("e", r, t)
            send(ctl.dispatchable())
        else:
            n += 1
            job = Job(f"j{n}", "t", "default", prompt_tokens=100, max_tokens=200)
            if isinstance(ctl.arrive(job), Dispatched):
                send([job])
            most_queued = max(most_queued, ctl.queued)
            queued_after.append((t, ctl.queued))
    stale_at = 20 + 3.0
    per_interval = max(sum(k for t, k, _ in sends if s <= t < s + 1) for s in range(23))
    assert max(w for t, w in waiting if t <= stale_at) <= 1 + per_interval
    settled = next(t for t, w in waiting if t > 1.0 and w <= 1)
    assert max(w for t, w in waiting if settled <= t <= stale_at) <= 1
    assert most_queued > 100  # the backlog waited in the gateway, not in the engine
    late = [k for t, k, _ in sends if t > stale_at]
    assert late[0] > 100  # the backlog, at once
    assert all(q == 0 for t, q in queued_after if t > stale_at)
