"""Property tests: random interleavings of arrive, dispatch, complete, cancel, fail, tick.

After every step the queue respects its bounds and the in-flight count matches what was
dispatched; at the end every job reached exactly one terminal state, in-flight and queued
counts are zero, and every bucket balance equals what an independent replay of the
reservations and settlements implies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.helpers import arrive, store_of
from velvetrope.clock import ManualClock
from velvetrope.core import (
    AdmissionController,
    Dispatched,
    Job,
    Outcome,
    PolicyConfig,
    Queued,
    Reason,
    Rejected,
    Usage,
    preset_names,
)

TENANTS = ("a", "b", "c")
TIERS = ("gold", "silver", "bronze")
MAX_QUEUED = 12
BAND_MAX = 6
TENANT_MAX = 5


def config(preset: str) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {
            "preset": preset,
            "queue": {"max_queued": MAX_QUEUED},
            "tiers": [
                {"name": "gold", "max_queued": BAND_MAX, "max_wait_s": 30},
                {"name": "silver", "max_queued": BAND_MAX, "min_share": 0.2},
                {"name": "bronze", "max_queued": BAND_MAX, "max_wait_s": 8},
            ],
            "tenants": [
                {
                    "name": "a",
                    "tier": "gold",
                    "max_queued": TENANT_MAX,
                    "limits": {"tokens_per_minute": 60_000, "requests_per_minute": 600},
                },
                {
                    "name": "b",
                    "tier": "silver",
                    "max_queued": TENANT_MAX,
                    "weight": 2,
                    "limits": {"tokens_per_minute": 6_000, "token_debt_floor": -1000},
                },
                {"name": "c", "tier": "bronze", "max_queued": TENANT_MAX},
            ],
            "pools": [{"name": "default", "max_in_flight": 3, "max_tokens_in_flight": 3000}],
            "models": {"m": {"tokens_per_minute": 30_000}},
        }
    )


class RefBucket:
    """An independent replay of one bucket: refill, reserve, settle with clamps."""

    def __init__(self, cap: float, rate: float, floor: float) -> None:
        self.cap, self.rate, self.floor = cap, rate, floor
        self.level, self.t = cap, 0.0

    def at(self, t: float) -> None:
        self.level = min(self.cap, self.level + (t - self.t) * self.rate)
        self.t = t


@dataclass
class Model:
    jobs: dict[str, Job] = field(default_factory=dict)
    dispatched: set[str] = field(default_factory=set)
    queued: set[str] = field(default_factory=set)
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)
    usages: dict[str, Usage] = field(default_factory=dict)


op = st.one_of(
    st.tuples(
        st.just("arrive"),
        st.sampled_from(TENANTS),
        st.sampled_from((*TIERS, "gold")),
        st.integers(0, 1500),
        st.integers(1, 800),
        st.booleans(),
    ),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("complete"), st.integers(0, 50), st.integers(0, 1200)),
    st.tuples(st.just("cancel"), st.integers(0, 50), st.integers(0, 300)),
    st.tuples(st.just("fail"), st.integers(0, 50)),
    st.tuples(st.just("tick"), st.floats(0.0, 5.0)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(preset_names()), ops=st.lists(op, max_size=120))
def test_random_interleavings_keep_every_invariant(preset: str, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    clock = ManualClock()
    ctl = AdmissionController(config(preset), clock)
    m = Model()
    events: list[tuple[float, str, str, float, float]] = []  # (t, kind, key, a, b), in order

    def observe(o: Outcome) -> None:
        m.outcomes.setdefault(o.job.id, []).append(o)
        for key, reserved, actual in o.settlement.lines:
            events.append((o.at, "settle", key, reserved, actual))

    ctl.observers.append(observe)
    n = 0

    def started(jobs: list[Job]) -> None:
        for j in jobs:
            m.queued.discard(j.id)
            m.dispatched.add(j.id)

    for o in ops:
        kind = o[0]
        if kind == "arrive":
            _, tenant, tier, prompt, max_tokens, model = o
            n += 1
            job = Job(
                id=f"j{n}",
                tenant=tenant,
                tier=ctl.resolve_tier(tenant, tier),
                prompt_tokens=prompt,
                max_tokens=max_tokens,
                model="m" if model else None,
            )
            m.jobs[job.id] = job
            d = arrive(ctl, job)
            for c in job.claims:
                events.append((clock.now(), "reserve", c.key, c.amount, 0.0))
            if isinstance(d, Dispatched):
                m.dispatched.add(job.id)
            elif isinstance(d, Queued):
                m.queued.add(job.id)
            else:
                assert isinstance(d, Rejected)
                assert d.status in (429, 503)
        elif kind == "dispatch":
            started(ctl.dispatchable())
        elif kind in ("complete", "cancel", "fail"):
            pool = sorted(m.dispatched) if kind != "cancel" else sorted(m.dispatched | m.queued)
            if not pool:
                continue
            jid = pool[o[1] % len(pool)]
            was_queued = jid in m.queued
            if kind == "complete":
                usage = Usage(m.jobs[jid].prompt_tokens, o[2])
                ctl.complete(jid, usage)
            elif kind == "cancel":
                usage = Usage(m.jobs[jid].prompt_tokens, o[2])
                ctl.cancel(jid, usage)
                if was_queued:
                    usage = Usage(0, 0)
            else:
                usage = Usage(0, 0)
                ctl.fail(jid, Reason.UPSTREAM_TIMEOUT)
            m.usages[jid] = usage
            m.dispatched.discard(jid)
            m.queued.discard(jid)
        else:
            clock.advance(o[1])
            for out in ctl.tick():
                m.queued.discard(out.job.id)
        # invariants after every step
        st_ = ctl.status()
        assert ctl.queued == len(m.queued) <= MAX_QUEUED
        assert ctl.in_flight == len(m.dispatched)
        for band in st_["pools"]["default"]["bands"].values():
            assert band["queued"] <= BAND_MAX
        for t, q in st_["tenants_queued"].items():
            assert q <= TENANT_MAX, t
        assert st_["pools"]["default"]["in_flight"] <= 3

    # finish everything
    while m.dispatched or m.queued:
        for jid in sorted(m.dispatched):
            u = Usage(m.jobs[jid].prompt_tokens, 10)
            ctl.complete(jid, u)
            m.usages[jid] = u
            m.dispatched.discard(jid)
        started(ctl.dispatchable())
        for out in ctl.tick():
            m.queued.discard(out.job.id)
    assert ctl.in_flight == 0 and ctl.queued == 0
    st_ = ctl.status()
    assert st_["pools"]["default"]["tokens_in_flight"] == 0
    assert st_["pools"]["default"]["queued_tokens"] == 0

    # every job: exactly one terminal state, reported once, with a consistent settlement
    for jid, job in m.jobs.items():
        outs = m.outcomes.get(jid, [])
        assert len(outs) == 1, (jid, job.state, outs)
        out = outs[0]
        assert job.terminal and out.state is job.state
        used = m.usages.get(jid)
        for key, _reserved, actual in out.settlement.lines:
            if key.endswith(":tok"):
                expected = used.total if used is not None else 0
                assert actual == expected

    # bucket balances equal an independent replay of reservations and settlements
    cfg = config(preset)
    specs: dict[str, tuple[float, float, float]] = {
        "tenant:a:tok": (60_000, 1000, -60_000),
        "tenant:a:req": (600, 10, -600),
        "tenant:b:tok": (6_000, 100, -1000),
        "model:m:tok": (30_000, 500, -30_000),
    }
    assert cfg.tenants[0].limits is not None
    refs = {k: RefBucket(*v) for k, v in specs.items()}
    for t, kind, key, a, b in events:
        r = refs[key]
        r.at(t)
        if kind == "reserve":
            r.level -= a
        else:
            r.level = max(r.floor, min(r.cap, r.level + a - b))
    levels = {k: level for k, (level, _) in store_of(ctl).levels().items()}
    for key, r in refs.items():
        if key in levels:
            r.at(clock.now())
            assert abs(levels[key] - r.level) < 1e-6, key
