"""Fast-forward is exact: a batcher advanced by decode runs is, at every point the caller can
observe it, in the very state of one stepped call by call, with the same events at the same
times (bit for bit) — for every built-in profile, with and without preemption, in both
scheduling modes, with prefix caching, and with speculative decoding (where no run is
planned).  Random programs of adds, aborts, steps and runs cut at random points drive two
batchers side by side; after every operation their whole state is compared."""

from __future__ import annotations

import random
import types
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from velvetrope.engine import Batcher, EngineProfile, list_profiles, load_profile
from velvetrope.engine.fastforward import DecodeRun, RunCounts, plan_decode_run
from velvetrope.engine.prefix_cache import PrefixCachingAllocator
from velvetrope.engine.queues import SeqRecord


def small(profile: EngineProfile, **kw: Any) -> EngineProfile:
    """``profile`` with a 640-token KV cache, so that a busy batch preempts."""
    base = {
        "num_gpu_blocks": 40,
        "block_size": 16,
        "max_model_len": 320,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
    }
    return profile.with_overrides(**{**base, **kw})


# the built-ins of distinct shapes: the V1-mode ones and the vLLM 0.6 (V0, multi-step) ones;
# the *-vllm-v1 profiles differ from the first only in their numbers
PROFILES = [load_profile(name) for name in list_profiles() if not name.endswith("-vllm-v1")]
SMALL = [small(p) for p in PROFILES if p.scheduler == "vllm-v1"]
# tensor-parallel terms: a constant and a per-token part in every step's duration
TP = small(PROFILES[0], tensor_parallel_size=4, tp_allreduce_s=0.0016, tp_per_token_s=3e-7)


SEQ_FIELDS = sorted(
    name
    for name, v in vars(SeqRecord).items()
    if isinstance(v, types.MemberDescriptorType | types.GetSetDescriptorType) and name != "blocks"
)
"""A sequence record's fields but its block table (slots, or a compiled class's attributes)."""


def snapshot(b: Batcher) -> dict[str, Any]:
    """Everything a later step could depend on, and everything a caller could read."""
    seqs = {
        sid: {slot: getattr(s, slot) for slot in SEQ_FIELDS} | {"blocks": list(s.blocks)}
        for sid, s in b._seqs.items()
    }
    kv = b._kv
    if isinstance(kv, PrefixCachingAllocator):
        pool: Any = (list(kv._free), list(kv._ref), list(kv._hash), kv.evictions)
    else:
        pool = list(kv._free)
    waiting = [
        s.seq_id
        for s in (b._waiting._q if hasattr(b._waiting, "_q") else [e[3] for e in b._waiting._h])
        if s.state == 0
    ]
    return {
        "seqs": seqs,
        "running": [s.seq_id for s in b._running],
        "waiting": sorted(waiting) if b._priority else waiting,
        "n_waiting": b._n_waiting,
        "steps": b.num_steps,
        "preemptions": b.num_preemptions,
        "order": b._order,
        "anchor": b._anchor,
        "pool": pool,
        "pc": (b.prefix_cache_queries, b.prefix_cache_hits),
        "spec": (b.spec_draft_tokens, b.spec_accepted_tokens, b._rng.getstate()),
    }


class Pair:
    """A stepped batcher and a fast-forwarded one, driven through the same program."""

    def __init__(self, profile: EngineProfile, priority: bool) -> None:
        kw: dict[str, Any] = {"priority": priority, "token_events": False, "seed": 7}
        self.ref = Batcher(profile, **kw)
        self.ff = Batcher(profile, **kw)
        self.t = 0.0
        self.seen: Counter[str] = Counter()

    def check(self) -> None:
        assert snapshot(self.ff) == snapshot(self.ref)
        for b in (self.ref, self.ff):  # the free-block counter follows the free list
            assert b._kv.num_free == len(b._kv.free_ids())

    def add(self, sid: str, prompt: int, output: int, prio: int, prefix: int) -> None:
        p = self.ref.profile
        prompt = min(prompt, p.max_model_len - 1)
        output = min(output, p.max_model_len - prompt)
        pid = f"app{prefix % 3}" if prefix else None
        for b in (self.ref, self.ff):
            b.add(sid, prompt, output, self.t, prio, prefix_id=pid, prefix_tokens=prompt // 2)

    def abort(self, pick: int) -> None:
        ids = sorted(self.ref.seq_ids())
        if ids:
            sid = ids[pick % len(ids)]
            assert self.ref.abort(sid) == self.ff.abort(sid)

    def step(self) -> None:
        a, b = self.ref.step(self.t), self.ff.step(self.t)
        assert a == b
        self.t = a.end

    def run(self, cut: float) -> None:
        """Plan a run; apply it up to a cut point while the reference steps as far."""
        if not self.ref.has_work:
            return
        run = plan_decode_run(self.ff, self.t)
        if run is None:
            self.seen["no run"] += 1
            self.step()
            return
        assert run.start(0) == self.t
        j = min(run.steps, int(cut * (run.steps + 1)))
        self.seen["run"] += 1
        self.seen["cut" if j < run.steps else "whole"] += 1
        if j == run.steps:
            self.seen["finishes" if run.finishes else "block-limited"] += 1
        if self.ref._n_waiting:
            self.seen["waiting head blocked"] += 1
        if j:
            pure = Counter(
                (s.computed + 1) % self.ref.profile.block_size == 1 for s in self.ref._running
            )
            self.seen["block boundary"] += pure[True] > 0
        mid = int(cut * cut * j)  # brought up to date on the way (as an engine scrape does)
        events: list[Any] = []
        for i in range(j):
            if i == mid:
                assert run.apply(mid) == []
                assert run.applied == mid
                self.check()
                self.seen["applied in two parts"] += mid > 0
            r = self.ref.step(self.t)
            assert r.prefill_tokens == r.verify_tokens == 0
            assert r.start == run.start(i)
            assert r.end == run.start(i + 1)
            if i + 1 < run.steps:  # a reading of the run as it stands, nothing applied
                assert run.kv_usage(i + 1) == self.ref.kv_usage
            if i < j - 1:
                assert r.events == []
            events = r.events
            self.t = r.end
        assert run.apply(j) == events
        if j == 0:
            self.t = run.start(0)


_add = st.tuples(
    st.just("add"),
    st.integers(1, 300),
    st.integers(1, 200),
    st.integers(0, 3),
    st.integers(0, 3),
)
_abort = st.tuples(st.just("abort"), st.integers(0, 1_000))
_run = st.tuples(st.just("run"), st.floats(0.0, 1.0))
_ops = st.lists(st.one_of(_add, _add, _abort, _run, _run, _run, _run), min_size=5, max_size=60)


def play(profile: EngineProfile, priority: bool, ops: list[tuple[Any, ...]]) -> Pair:
    pair = Pair(profile, priority)
    for n, op in enumerate(ops):
        if op[0] == "add":
            pair.add(f"s{n}", op[1], op[2], op[3], op[4])
        elif op[0] == "abort":
            pair.abort(op[1])
        else:
            pair.run(op[1])
        pair.check()
    while pair.ref.has_work:
        pair.run(1.0)
        pair.check()
    assert not pair.ff.has_work
    return pair


@pytest.mark.parametrize("priority", [False, True])
@pytest.mark.parametrize(
    "profile", [*PROFILES, *SMALL, TP], ids=lambda p: f"{p.name}-{p.num_gpu_blocks}"
)
@settings(max_examples=40, deadline=None)
@given(ops=_ops)
def test_decode_runs_equal_step_by_step(
    profile: EngineProfile, priority: bool, ops: list[tuple[Any, ...]]
) -> None:
    play(profile, priority, ops)


@pytest.mark.parametrize("priority", [False, True])
@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("profile", SMALL, ids=lambda p: p.name)
@settings(max_examples=40, deadline=None)
@given(ops=_ops)
def test_decode_runs_equal_step_by_step_v0(
    profile: EngineProfile, steps: int, priority: bool, ops: list[tuple[Any, ...]]
) -> None:
    """vLLM V0's order (waiting prompts first, whole) checks admission before the running
    sequences take their blocks; with multi-step scheduling only every ``steps``-th step
    tries, counted by the step count a run advances."""
    v0 = profile.with_overrides(scheduler="vllm-v0", num_scheduler_steps=steps)
    play(v0, priority, ops)


@pytest.mark.parametrize("priority", [False, True])
@settings(max_examples=40, deadline=None)
@given(ops=_ops)
def test_decode_runs_equal_step_by_step_with_prefix_caching(
    priority: bool, ops: list[tuple[Any, ...]]
) -> None:
    play(small(PROFILES[0], enable_prefix_caching=True), priority, ops)


def program(seed: int, n: int) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    ops: list[tuple[Any, ...]] = []
    for _ in range(n):
        x = rng.random()
        if x < 0.3:
            ops.append(("add", rng.randint(1, 300), rng.randint(1, 200), rng.randint(0, 3), 0))
        elif x < 0.35:
            ops.append(("abort", rng.randint(0, 1000)))
        else:
            ops.append(("run", rng.choice([0.0, 0.3, 0.7, 1.0])))
    return ops


def test_the_snapshot_sees_every_field() -> None:
    assert len(SEQ_FIELDS) == 19 and "generated" in SEQ_FIELDS and "state" in SEQ_FIELDS


@pytest.mark.parametrize("profile", [*SMALL, TP], ids=lambda p: p.name)
def test_seeded_programs_cover_every_kind_of_run(profile: EngineProfile) -> None:
    """The random programs above are not vacuous: runs happen, are cut at every kind of
    point, end in finishes and at the block limit, cross block boundaries, wait behind a
    blocked head, and the small cache preempts."""
    seen: Counter[str] = Counter()
    preemptions = 0
    for seed in range(6):
        for priority in (False, True):
            v0 = profile.with_overrides(scheduler="vllm-v0", num_scheduler_steps=1 + seed % 3)
            pair = play(v0 if seed % 2 else profile, priority, program(seed, 300))
            seen += pair.seen
            preemptions += pair.ref.num_preemptions
    kinds = ["run", "no run", "cut", "whole", "finishes", "block-limited", "block boundary"]
    kinds.append("applied in two parts")
    assert all(seen[k] > 0 for k in kinds), seen
    assert seen["waiting head blocked"] > 0, seen
    assert preemptions > 0


def test_speculative_decoding_plans_no_run_and_stays_exact() -> None:
    """With speculative decoding a step draws random acceptances: no closed form, so no run
    is planned and the caller steps (the comparison above still holds)."""
    profile = small(PROFILES[0], spec_tokens=3, spec_acceptance=0.7)
    pair = play(profile, False, program(1, 200))
    assert pair.seen["run"] == 0
    assert pair.seen["no run"] > 0
    assert pair.ref.spec_draft_tokens > 0


def test_token_events_plan_no_run() -> None:
    b = Batcher(PROFILES[0])  # token_events=True: every decode step has events
    b.add("a", 10, 50, 0.0)
    b.step(0.0)
    assert plan_decode_run(b, 1.0) is None


def test_a_stale_run_refuses_to_apply() -> None:
    b = Batcher(PROFILES[0], token_events=False)
    b.add("a", 10, 50, 0.0)
    t = b.step(0.0).end
    run = plan_decode_run(b, t)
    assert run is not None
    assert run.steps == 49
    b.add("b", 10, 5, t)
    with pytest.raises(RuntimeError, match="changed"):
        run.apply(3)
    run = plan_decode_run(b, t)
    assert run is None  # b waits to be admitted and fits
    b.step(t)
    run = plan_decode_run(b, t)
    assert run is not None
    run.apply(1)
    b.step(run.start(1))  # the batcher moves on its own: the run is stale
    with pytest.raises(RuntimeError, match="changed"):
        run.apply(2)
    b = Batcher(PROFILES[0], token_events=False)
    b.add("c", 10, 50, 0.0)
    run = plan_decode_run(b, b.step(0.0).end)
    assert run is not None
    run.apply(2)
    with pytest.raises(ValueError, match="cannot apply"):
        run.apply(1)  # no way back
    run.apply(run.steps)
    with pytest.raises(ValueError, match="cannot apply"):
        run.apply(run.steps)  # spent


@pytest.mark.parametrize("profile", [PROFILES[0], None], ids=["closed form", "summed"])
def test_a_run_tallies_its_applications_and_ties(profile: EngineProfile | None) -> None:
    """``counts`` records each application (whole or cut, and the steps it advanced) and
    each ``started`` asked at the very start of a step, by its ``inclusive``."""
    b = Batcher(profile or Odd.of(PROFILES[0]), token_events=False)
    b.add("a", 10, 50, 0.0)
    counts = RunCounts()
    run = DecodeRun(b, counts)
    assert run.plan(b.step(0.0).end)
    assert run.steps == 49
    t3 = run.start(3)
    assert run.started(t3, inclusive=True) == 4
    assert run.started(t3, inclusive=False) == 3
    assert run.started((run.start(3) + run.start(4)) / 2, inclusive=True) == 4  # no tie
    assert counts == RunCounts(ties_inclusive=1, ties_exclusive=1)
    assert run.apply(3) == []
    assert run.apply(3) == []  # nothing new: not counted
    assert len(run.apply(run.steps)) == 1
    assert counts == RunCounts(whole=1, cut=1, steps=49, ties_inclusive=1, ties_exclusive=1)
    assert plan_decode_run(b, 0.0) is None
    other = DecodeRun(b)
    assert other.counts == RunCounts() and other.counts is not counts


@dataclass(frozen=True, slots=True)
class Odd(EngineProfile):
    """A profile whose step time is not the linear formula the closed form assumes."""

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, context_tokens: int, verify_tokens: int = 0
    ) -> float:
        return 0.01 + 1e-9 * context_tokens**2 + 1e-4 * (prefill_tokens + decode_seqs)

    @classmethod
    def of(cls, profile: EngineProfile) -> Odd:
        """``profile``'s settings with this step time."""
        return cls(**{f.name: getattr(profile, f.name) for f in fields(EngineProfile)})


def test_a_step_time_the_closed_form_does_not_know_is_still_exact() -> None:
    """The closed form is checked against ``step_time`` and gives way to per-step calls."""
    odd = Odd.of(SMALL[0])
    pair = play(odd, False, program(2, 200))
    assert pair.seen["run"] > 0
