"""Property tests: random adds, aborts and steps against a KV cache small enough to preempt.

After every operation the block accounting must be exact; by the end every sequence must
have finished with exactly its requested output (one first token, however often it was
preempted) or been aborted, and every block must be free again.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import event, given, settings
from hypothesis import strategies as st

from velvetrope.engine import (
    Batcher,
    EngineProfile,
    Finished,
    FirstToken,
    Preempted,
    StepResult,
    Tokens,
)
from velvetrope.engine.kvcache import blocks_for

SMALL = EngineProfile(
    name="small",
    description="a 48-token KV cache, so that preemption is common",
    step_base_s=0.01,
    per_prefill_token_s=0.001,
    per_decode_seq_s=0.002,
    per_context_token_s=0.0001,
    block_size=4,
    num_gpu_blocks=12,
    max_num_seqs=4,
    max_num_batched_tokens=16,
    max_model_len=48,
)


@dataclass
class Ledger:
    """What the test expects, kept independently of the batcher."""

    requested: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> prompt, output
    live: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    tokens: Counter[str] = field(default_factory=Counter)
    first_tokens: Counter[str] = field(default_factory=Counter)
    preemptions: Counter[str] = field(default_factory=Counter)
    clock: float = 0.0


def check_state(b: Batcher, ledger: Ledger) -> None:
    profile = b.profile
    assert 0 <= b.used_blocks <= b.total_blocks
    assert b.used_blocks + b.free_blocks == b.total_blocks
    assert b.free_blocks == len(b._kv.free_ids())  # the counter follows the free list
    assert b.kv_usage == b.used_blocks / b.total_blocks
    assert set(b.seq_ids()) == ledger.live
    assert b.num_running + b.num_waiting == len(ledger.live)
    assert b.num_running <= profile.max_num_seqs
    assert b.has_work == bool(ledger.live)
    owned: list[int] = []
    for seq_id in ledger.live:
        s = b.seq_state(seq_id)
        assert s is not None
        owned += s.block_ids
        if s.status == "waiting":
            assert (s.num_blocks, s.computed_tokens) == (0, 0)
        else:
            assert s.num_blocks == blocks_for(s.computed_tokens, profile.block_size)
        assert s.generated_tokens == ledger.tokens[seq_id] < s.output_tokens
        assert s.computed_tokens <= s.prompt_tokens + s.generated_tokens
    # Each block belongs to at most one sequence; the owned ones are exactly the used ones.
    assert len(owned) == len(set(owned)) == b.used_blocks
    assert all(0 <= block < b.total_blocks for block in owned)


def apply_step(b: Batcher, ledger: Ledger, r: StepResult) -> None:
    profile = b.profile
    assert r.start == ledger.clock
    assert r.prefill_tokens + r.decode_seqs <= profile.max_num_batched_tokens
    if r.prefill_tokens or r.decode_seqs:
        assert r.duration == profile.step_time(r.prefill_tokens, r.decode_seqs, r.context_tokens)
    else:
        assert r.duration == 0.0
    ledger.clock = r.start + r.duration
    produced_this_step: set[str] = set()
    preempted_this_step: set[str] = set()
    for e in r.events:
        assert e.t == ledger.clock
        assert e.seq_id in ledger.live, f"event for a sequence that is not live: {e}"
        if isinstance(e, Preempted):
            assert not produced_this_step, "Preempted events come first"
            preempted_this_step.add(e.seq_id)
            ledger.preemptions[e.seq_id] += 1
            continue
        assert e.seq_id not in preempted_this_step, "a preempted sequence ran in its step"
        if isinstance(e, FirstToken):
            assert ledger.tokens[e.seq_id] == 0
            ledger.first_tokens[e.seq_id] += 1
        elif isinstance(e, Tokens):
            assert e.n == 1
            assert ledger.first_tokens[e.seq_id] == 1
            assert e.seq_id not in produced_this_step
            produced_this_step.add(e.seq_id)
            ledger.tokens[e.seq_id] += e.n
        else:
            assert isinstance(e, Finished)
            assert e.seq_id in produced_this_step  # Finished follows that step's Tokens
            prompt, output = ledger.requested[e.seq_id]
            assert (e.prompt_tokens, e.output_tokens) == (prompt, output)
            assert ledger.tokens[e.seq_id] == output
            ledger.live.discard(e.seq_id)
            ledger.finished.add(e.seq_id)


def check_end(b: Batcher, ledger: Ledger) -> None:
    assert not b.has_work
    assert not ledger.live
    assert ledger.finished | ledger.aborted == set(ledger.requested)
    assert not ledger.finished & ledger.aborted
    for seq_id in ledger.finished:
        assert ledger.tokens[seq_id] == ledger.requested[seq_id][1]
        assert ledger.first_tokens[seq_id] == 1
    assert b.used_blocks == 0
    assert b.free_blocks == b.total_blocks
    assert b.num_preemptions == sum(ledger.preemptions.values())


def drain(b: Batcher, ledger: Ledger) -> None:
    for _ in range(5_000):
        if not b.has_work:
            return
        apply_step(b, ledger, b.step(ledger.clock))
        check_state(b, ledger)
    raise AssertionError("the batcher did not drain in 5,000 steps")


# An operation: ("add", prompt, output, priority), ("abort", pick), ("step", idle gap).
# prompt <= 30 and output <= 18 keep every sequence within max_model_len (48).
_add = st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 18), st.integers(0, 3))
_abort = st.tuples(st.just("abort"), st.integers(0, 1_000))
_step = st.tuples(st.just("step"), st.sampled_from([0.0, 0.0, 0.0, 0.5]))
_ops = st.lists(st.one_of(_add, _add, _add, _abort, _step, _step), min_size=8, max_size=80)


def run_program(ops: list[tuple[object, ...]], priority: bool) -> None:
    """Apply ``ops``, then drain; check the invariants after every operation."""
    b = Batcher(SMALL, priority=priority)
    ledger = Ledger()
    for n, op in enumerate(ops):
        if op[0] == "add":
            _, prompt, output, prio = op
            assert isinstance(prompt, int)
            assert isinstance(output, int)
            assert isinstance(prio, int)
            seq_id = f"s{n}"
            b.add(seq_id, prompt, output, now=ledger.clock, priority=prio)
            ledger.requested[seq_id] = (prompt, output)
            ledger.live.add(seq_id)
        elif op[0] == "abort":
            pick = op[1]
            assert isinstance(pick, int)
            candidates = sorted(ledger.requested)
            if candidates:
                seq_id = candidates[pick % len(candidates)]
                assert b.abort(seq_id) == (seq_id in ledger.live)
                if seq_id in ledger.live:
                    ledger.live.discard(seq_id)
                    ledger.aborted.add(seq_id)
        else:
            gap = op[1]
            assert isinstance(gap, float)
            ledger.clock += gap  # the engine may sit idle between steps
            apply_step(b, ledger, b.step(ledger.clock))
        check_state(b, ledger)
    drain(b, ledger)
    check_end(b, ledger)
    event("preempted" if b.num_preemptions else "no preemption")


@settings(max_examples=200, deadline=None)
@given(ops=_ops)
def test_fcfs_accounting_holds_under_random_traffic(ops: list[tuple[object, ...]]) -> None:
    run_program(ops, priority=False)


@settings(max_examples=200, deadline=None)
@given(ops=_ops)
def test_priority_accounting_holds_under_random_traffic(ops: list[tuple[object, ...]]) -> None:
    run_program(ops, priority=True)


def test_the_small_profile_really_preempts_and_recovers() -> None:
    """A seeded heavy workload: proves the property tests' cache forces preemption."""
    rng = random.Random(20240601)
    for priority in (False, True):
        b = Batcher(SMALL, priority=priority)
        ledger = Ledger()
        for i in range(40):
            prompt, output = rng.randint(8, 30), rng.randint(8, 18)
            b.add(f"r{i}", prompt, output, now=ledger.clock, priority=rng.randint(0, 3))
            ledger.requested[f"r{i}"] = (prompt, output)
            ledger.live.add(f"r{i}")
            if i % 3 == 0:
                apply_step(b, ledger, b.step(ledger.clock))
                check_state(b, ledger)
        drain(b, ledger)
        check_end(b, ledger)
        assert b.num_preemptions >= 5
        preempted = [s for s, n in ledger.preemptions.items() if n]
        assert preempted
        assert all(s in ledger.finished for s in preempted)
