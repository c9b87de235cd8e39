"""The continuous batcher: timing, chunked prefill, limits, aborts, preemption, priority.

Coefficients are powers of two so that every expected timestamp is computed exactly.
"""

from __future__ import annotations

from collections import Counter

import pytest

from velvetrope.engine import (
    Batcher,
    EngineEvent,
    EngineProfile,
    Finished,
    FirstToken,
    Preempted,
    StepResult,
    Tokens,
)
from velvetrope.errors import PolicyError

BASE, PREFILL, DECODE, CONTEXT = 2.0**-6, 2.0**-10, 2.0**-8, 2.0**-12


def make_profile(
    *,
    block_size: int = 16,
    num_gpu_blocks: int = 64,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 512,
) -> EngineProfile:
    return EngineProfile(
        name="test",
        description="exact binary coefficients",
        step_base_s=BASE,
        per_prefill_token_s=PREFILL,
        per_decode_seq_s=DECODE,
        per_context_token_s=CONTEXT,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
    )


def f(prefill: int, decode: int, context: int) -> float:
    return BASE + PREFILL * prefill + DECODE * decode + CONTEXT * context


def drive(b: Batcher, t: float = 0.0, limit: int = 10_000) -> list[StepResult]:
    """Step back to back (each step starts when the previous ends) until no work is left."""
    results: list[StepResult] = []
    while b.has_work:
        assert len(results) < limit, "batcher did not drain"
        r = b.step(t)
        t = r.start + r.duration
        results.append(r)
    return results


def events_of(results: list[StepResult]) -> list[EngineEvent]:
    return [e for r in results for e in r.events]


def tokens_by_seq(events: list[EngineEvent]) -> Counter[str]:
    out: Counter[str] = Counter()
    for e in events:
        if isinstance(e, Tokens):
            out[e.seq_id] += e.n
    return out


def test_a_step_without_work_is_empty_and_free() -> None:
    b = Batcher(make_profile())
    r = b.step(3.5)
    assert r == StepResult(3.5, 0.0, [], 0, 0, 0)
    assert not b.has_work
    assert b.num_steps == 0


def test_single_sequence_timing_is_the_sum_of_step_times() -> None:
    b = Batcher(make_profile())
    b.add("a", 40, 5, now=0.0)
    results = drive(b, t=1.0)

    # One prefill step (40 <= budget 64) ending with the first token, then one decode step
    # per further token, each attending to everything cached so far.
    assert [(r.prefill_tokens, r.decode_seqs, r.context_tokens) for r in results] == [
        (40, 0, 40),
        (0, 1, 41),
        (0, 1, 42),
        (0, 1, 43),
        (0, 1, 44),
    ]
    expected_ends = []
    t = 1.0
    for r in results:
        assert r.start == t
        assert r.duration == f(r.prefill_tokens, r.decode_seqs, r.context_tokens)
        t += r.duration
        expected_ends.append(t)

    events = events_of(results)
    assert events[:2] == [FirstToken("a", 1.0 + f(40, 0, 40)), Tokens("a", 1, 1.0 + f(40, 0, 40))]
    assert [e.t for e in events if isinstance(e, Tokens)] == expected_ends
    assert events[-1] == Finished("a", expected_ends[-1], prompt_tokens=40, output_tokens=5)
    assert expected_ends[-1] == 1.0 + f(40, 0, 40) + sum(f(0, 1, 40 + k) for k in range(1, 5))
    assert b.used_blocks == 0
    assert b.num_running == 0


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget() -> None:
    b = Batcher(make_profile(max_num_batched_tokens=64, block_size=16))
    b.add("long", 150, 2, now=0.0)
    blocks_after = []
    results: list[StepResult] = []
    for _ in range(3):
        results.append(b.step(0.0 if not results else results[-1].end))
        state = b.seq_state("long")
        assert state is not None
        blocks_after.append(state.num_blocks)
    assert [r.prefill_tokens for r in results] == [64, 64, 22]
    assert [r.context_tokens for r in results] == [64, 128, 150]
    assert blocks_after == [4, 8, 10]  # ceil(cached / 16): blocks grow with the prefill
    # Only the step that completes the prompt emits the first token.
    assert [[type(e) for e in r.events] for r in results] == [[], [], [FirstToken, Tokens]]
    last = drive(b, results[-1].end)
    assert [(r.prefill_tokens, r.decode_seqs) for r in last] == [(0, 1)]
    assert isinstance(last[0].events[-1], Finished)


def test_decodes_take_their_token_before_new_prefills_share_the_budget() -> None:
    b = Batcher(make_profile(max_num_batched_tokens=64))
    b.add("old", 10, 10, now=0.0)
    first = b.step(0.0)
    b.add("new", 200, 1, now=first.end)
    r = b.step(first.end)
    # old decodes 1 token, new gets the remaining 63 of the budget for its first chunk.
    assert (r.prefill_tokens, r.decode_seqs, r.context_tokens) == (63, 1, 11 + 63)
    assert r.duration == f(63, 1, 74)


def test_max_num_seqs_bounds_the_running_batch_and_waiting_is_fcfs() -> None:
    b = Batcher(make_profile(max_num_seqs=2, max_num_batched_tokens=64))
    for i in range(5):
        b.add(f"s{i}", 8, 3, now=float(i))
    seen_running = []
    t = 0.0
    first_tokens = []
    while b.has_work:
        r = b.step(t)
        t = r.end
        seen_running.append(b.num_running)
        assert b.num_running + b.num_waiting == len(b.seq_ids())
        first_tokens += [e.seq_id for e in r.events if isinstance(e, FirstToken)]
    assert max(seen_running) == 2
    assert first_tokens == ["s0", "s1", "s2", "s3", "s4"]


def test_abort_frees_blocks_at_once_and_silences_the_sequence() -> None:
    b = Batcher(make_profile())
    b.add("gone", 100, 50, now=0.0)
    b.add("stays", 10, 3, now=0.0)
    b.add("queued", 10, 3, now=0.0)
    r = b.step(0.0)  # gone: 64-token chunk (4 blocks); stays: 0 (budget exhausted)
    assert b.used_blocks == 4
    assert b.abort("gone") is True
    assert b.used_blocks == 0
    assert b.free_blocks == b.total_blocks
    assert b.seq_state("gone") is None
    assert b.abort("gone") is False
    assert b.abort("never-added") is False
    assert b.abort("queued") is True
    assert b.num_waiting == 1  # only "stays" is left in the queue
    events = events_of(drive(b, r.end))
    assert {e.seq_id for e in events} == {"stays"}
    assert b.abort("stays") is False  # finished sequences are forgotten
    assert b.used_blocks == 0


def test_every_sequence_emits_exactly_its_requested_output() -> None:
    outputs = {"one": 1, "two": 2, "seventeen": 17, "fifty": 50}
    b = Batcher(make_profile())
    for seq_id, n in outputs.items():
        b.add(seq_id, 30, n, now=0.0)
    events = events_of(drive(b))
    assert tokens_by_seq(events) == Counter(outputs)
    assert Counter(e.seq_id for e in events if isinstance(e, FirstToken)) == Counter(outputs.keys())
    finished = {e.seq_id: e for e in events if isinstance(e, Finished)}
    assert {k: (v.prompt_tokens, v.output_tokens) for k, v in finished.items()} == {
        k: (30, n) for k, n in outputs.items()
    }


def test_events_in_a_step_are_ordered_and_stamped_with_its_end() -> None:
    b = Batcher(make_profile())
    b.add("x", 5, 1, now=0.0)
    b.add("y", 5, 3, now=0.0)
    r = b.step(2.0)
    end = 2.0 + f(10, 0, 10)
    assert r.events == [
        FirstToken("x", end),
        Tokens("x", 1, end),
        Finished("x", end, 5, 1),
        FirstToken("y", end),
        Tokens("y", 1, end),
    ]
    assert r.end == end


def test_add_rejects_bad_sequences() -> None:
    b = Batcher(make_profile(max_model_len=512))
    b.add("a", 10, 1, now=0.0)
    with pytest.raises(PolicyError, match="already"):
        b.add("a", 10, 1, now=0.0)
    with pytest.raises(PolicyError, match="max_model_len"):
        b.add("b", 500, 13, now=0.0)
    with pytest.raises(PolicyError, match=">= 1"):
        b.add("c", 0, 5, now=0.0)
    with pytest.raises(PolicyError, match=">= 1"):
        b.add("d", 5, 0, now=0.0)
    b.add("e", 500, 12, now=0.0)  # exactly max_model_len is fine
    drive(b)
    b.add("a", 3, 1, now=9.0)  # a finished id may be reused
    assert b.num_waiting == 1


def test_token_events_off_changes_nothing_but_the_tokens_events() -> None:
    runs = []
    for token_events in (True, False):
        b = Batcher(
            make_profile(num_gpu_blocks=8, block_size=4, max_model_len=32),
            token_events=token_events,
        )
        for i in range(6):
            b.add(f"s{i}", 5 + i, 4 + i, now=0.0)
        runs.append(drive(b))
    with_tokens, without = runs
    assert [r.duration for r in with_tokens] == [r.duration for r in without]
    assert [e for e in events_of(with_tokens) if not isinstance(e, Tokens)] == events_of(without)
    assert any(isinstance(e, Preempted) for e in events_of(without))


def _grow_two(b: Batcher, first: tuple[str, int], second: tuple[str, int]) -> list[StepResult]:
    """Admit two 8-token prompts (20 outputs) one step apart; run 9 steps in all.

    With block_size 4 and 8 blocks both then hold 4 full blocks: the cache is full and the
    first-admitted sequence needs a fifth block in the next step.
    """
    b.add(first[0], 8, 20, now=0.0, priority=first[1])
    results = [b.step(0.0)]
    b.add(second[0], 8, 20, now=results[-1].end, priority=second[1])
    results.append(b.step(results[-1].end))
    while len(results) < 9:
        results.append(b.step(results[-1].end))
    assert b.free_blocks == 0
    assert b.num_preemptions == 0
    return results


def test_fcfs_preempts_the_most_recently_admitted_and_recomputes_it() -> None:
    b = Batcher(make_profile(block_size=4, num_gpu_blocks=8, max_model_len=32, max_num_seqs=2))
    results = _grow_two(b, ("A", 0), ("B", 0))
    b.add("C", 2, 2, now=results[-1].end)  # queued behind the full batch (max_num_seqs 2)
    r = b.step(results[-1].end)
    # A needs a block, none is free: B (admitted last) loses its cache, A gets a block.
    assert r.events[0] == Preempted("B", r.end)
    assert [type(e) for e in r.events] == [Preempted, Tokens]
    assert (r.prefill_tokens, r.decode_seqs) == (0, 1)
    state = b.seq_state("B")
    assert state is not None
    assert (state.status, state.computed_tokens, state.num_blocks) == ("waiting", 0, 0)
    assert (state.generated_tokens, state.num_preemptions) == (8, 1)
    assert b.num_preemptions == 1
    assert b.num_waiting == 2

    rest = drive(b, r.end)
    # B went back to the front of the queue: it comes back (once A's blocks are free) before
    # C, which would have fit long before; and it re-prefills prompt + generated tokens.
    readmit = next(x for x in rest if any(e.seq_id == "B" for e in x.events))
    assert (readmit.prefill_tokens, readmit.context_tokens) == (8 + 8 + 2, 16 + 2)
    assert FirstToken("C", readmit.end) in readmit.events
    events = events_of([*results, r, *rest])
    assert tokens_by_seq(events) == Counter({"A": 20, "B": 20, "C": 2})
    assert sum(isinstance(e, FirstToken) and e.seq_id == "B" for e in events) == 1
    assert b.used_blocks == 0


def test_no_admission_in_a_step_that_preempted() -> None:
    b = Batcher(make_profile(block_size=4, num_gpu_blocks=8, max_model_len=32), priority=True)
    results = _grow_two(b, ("A", 0), ("B", 1))
    b.add("urgent", 1, 1, now=results[-1].end, priority=-1)
    r = b.step(results[-1].end)
    assert [e.seq_id for e in r.events if isinstance(e, Preempted)] == ["B"]
    assert b.seq_state("urgent") is not None  # blocks were free, yet it was not admitted
    nxt = b.step(r.end)
    assert Finished("urgent", nxt.end, 1, 1) in nxt.events


def test_priority_mode_preempts_the_lowest_priority_even_if_it_runs_first() -> None:
    b = Batcher(make_profile(block_size=4, num_gpu_blocks=8, max_model_len=32), priority=True)
    results = _grow_two(b, ("low", 5), ("high", 0))
    r = b.step(results[-1].end)
    # "low" runs first and needs a block; it is itself the victim, so nothing runs.
    assert r.events == [Preempted("low", r.start)]
    assert (r.duration, r.prefill_tokens, r.decode_seqs, r.context_tokens) == (0.0, 0, 0, 0)
    events = events_of(drive(b, r.end))
    finish_order = [e.seq_id for e in events if isinstance(e, Finished)]
    assert finish_order == ["high", "low"]
    assert tokens_by_seq(events) + tokens_by_seq(events_of(results)) == Counter(
        {"low": 20, "high": 20}
    )


def test_priority_mode_admits_by_priority_then_arrival() -> None:
    order = {}
    for priority_mode in (False, True):
        b = Batcher(make_profile(max_num_seqs=1), priority=priority_mode)
        for seq_id, prio, t in (("late-low", 3, 0.0), ("mid", 1, 0.1), ("hi-1", 0, 0.2)):
            b.add(seq_id, 4, 2, now=t, priority=prio)
        b.add("hi-2", 4, 2, now=0.3, priority=0)
        events = events_of(drive(b))
        order[priority_mode] = [e.seq_id for e in events if isinstance(e, FirstToken)]
    assert order[False] == ["late-low", "mid", "hi-1", "hi-2"]
    assert order[True] == ["hi-1", "hi-2", "mid", "late-low"]


def test_kv_usage_tracks_blocks() -> None:
    b = Batcher(make_profile(block_size=16, num_gpu_blocks=64))
    b.add("a", 33, 10, now=0.0)  # 33 tokens -> 3 blocks
    b.step(0.0)
    assert (b.used_blocks, b.free_blocks) == (3, 61)
    assert b.kv_usage == 3 / 64
    state = b.seq_state("a")
    assert state is not None
    assert state.status == "running"
    assert state.block_ids == (0, 1, 2)
