"""Automatic prefix caching: hash chains, hits, sharing, LRU eviction and block accounting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from velvetrope.engine import Batcher, EngineProfile
from velvetrope.engine.events import Finished
from velvetrope.engine.prefix_cache import PrefixCachingAllocator, block_hashes

BS = 4


def _profile(blocks: int = 64, **kw: int | float | bool) -> EngineProfile:
    return EngineProfile(
        name="pc",
        description="test",
        step_base_s=0.01,
        per_prefill_token_s=0.001,
        per_decode_seq_s=0.002,
        per_context_token_s=0.0,
        block_size=BS,
        num_gpu_blocks=blocks,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=min(256, blocks * BS),
        enable_prefix_caching=True,
    ).with_overrides(**kw)


def _drain(b: Batcher, t: float = 0.0) -> float:
    while b.has_work:
        t = b.step(t).end
    return t


# -- hash chains ---------------------------------------------------------------------------


def test_hash_chains_are_prefix_closed_and_distinct_per_prefix() -> None:
    a5, a3 = block_hashes("app-a", 5), block_hashes("app-a", 3)
    assert a5[:3] == a3 and len(set(a5)) == 5
    assert not set(block_hashes("app-b", 5)) & set(a5)
    assert block_hashes("app-a", 0) == ()


# -- the allocator on its own --------------------------------------------------------------


def test_allocator_shares_by_reference_and_keeps_freed_blocks_cached() -> None:
    pc = PrefixCachingAllocator(8, BS)
    h = block_hashes("p", 2)
    t1: list[int] = []
    pc.allocate(3, t1)
    assert t1 == [0, 1, 2] and pc.num_free == 5
    assert pc.register(t1[0], h[0]) and pc.register(t1[1], h[1])
    assert not pc.register(t1[2], h[0])  # the first copy of a content wins
    t2: list[int] = []
    hits = pc.lookup(h)
    assert hits == [0, 1]
    pc.acquire(hits, t2)
    assert [pc.refcount(b) for b in range(3)] == [2, 2, 1]
    assert pc.num_used == 3  # shared blocks count once
    pc.free(t1)
    assert t1 == [] and pc.refcount(0) == 1 and pc.num_free == 6  # block 2 is free again
    pc.free(t2)
    assert pc.num_free == 8 and pc.num_cached == 2  # freed, yet still cached
    assert pc.lookup(h) == [0, 1]


def test_allocation_evicts_least_recently_freed_first_and_tails_before_heads() -> None:
    pc = PrefixCachingAllocator(6, BS)
    a, b = block_hashes("a", 2), block_hashes("b", 2)
    ta: list[int] = []
    tb: list[int] = []
    pc.allocate(2, ta)
    pc.allocate(2, tb)
    for table, hashes in ((ta, a), (tb, b)):
        for blk, h in zip(table, hashes, strict=True):
            pc.register(blk, h)
    pc.free(ta)  # a freed first: least recently used
    pc.free(tb)
    grab: list[int] = []
    pc.allocate(3, grab)  # the two never-used blocks, then a's tail
    assert grab == [4, 5, 1]  # a = [0, 1] was freed tail first, so block 1 goes first
    assert pc.evictions == 1
    assert pc.lookup(a) == [0]  # a's head survives, its tail was evicted
    assert pc.lookup(b) == [2, 3]


def test_allocator_refuses_to_overcommit() -> None:
    pc = PrefixCachingAllocator(2, BS)
    t: list[int] = []
    with pytest.raises(ValueError, match="cannot allocate 3"):
        pc.allocate(3, t)
    assert t == [] and pc.num_free == 2


# -- hits through the batcher --------------------------------------------------------------


def test_a_second_request_of_the_same_prefix_skips_the_cached_blocks() -> None:
    b = Batcher(_profile())
    b.add("a", 20, 2, 0.0, prefix_id="sys", prefix_tokens=12)
    first = b.step(0.0)
    assert first.prefill_tokens == 20
    _drain(b, first.end)
    b.add("b", 22, 2, 10.0, prefix_id="sys", prefix_tokens=12)
    r = b.step(10.0)
    st = b.seq_state("b")
    assert st is not None and st.cached_tokens == 12
    assert r.prefill_tokens == 22 - 12
    assert b.prefix_cache_queries == 20 + 22
    assert b.prefix_cache_hits == 12


def test_finished_reports_the_prompt_tokens_found_cached_at_first_admission() -> None:
    b = Batcher(_profile())
    b.add("a", 20, 2, 0.0, prefix_id="sys", prefix_tokens=12)
    t = b.step(0.0).end
    ends = []
    while b.has_work:
        r = b.step(t)
        t = r.end
        ends += [e for e in r.events if isinstance(e, Finished)]
    b.add("b", 22, 3, t, prefix_id="sys", prefix_tokens=12)
    b.add("c", 22, 3, t, prefix_id="other", prefix_tokens=12)
    while b.has_work:
        r = b.step(t)
        t = r.end
        ends += [e for e in r.events if isinstance(e, Finished)]
    got = {e.seq_id: (e.prompt_tokens, e.cached_tokens) for e in ends}
    assert got == {"a": (20, 0), "b": (22, 12), "c": (22, 0)}
    assert b.prefix_cache_hits == 12
    off = Batcher(_profile(enable_prefix_caching=False))
    off.add("a", 20, 1, 0.0, prefix_id="sys", prefix_tokens=12)
    off.add("b", 20, 1, 0.0, prefix_id="sys", prefix_tokens=12)
    done = []
    t = 0.0
    while off.has_work:
        r = off.step(t)
        t = r.end
        done += [e.cached_tokens for e in r.events if isinstance(e, Finished)]
    assert done == [0, 0]


def test_a_prompt_that_is_all_prefix_still_computes_its_last_block() -> None:
    b = Batcher(_profile())
    b.add("a", 16, 1, 0.0, prefix_id="sys", prefix_tokens=16)
    _drain(b)
    b.add("b", 16, 1, 5.0, prefix_id="sys", prefix_tokens=16)
    r = b.step(5.0)
    assert r.prefill_tokens == 4  # (16 - 1) // 4 = 3 blocks hit, the 4th recomputed
    assert b.prefix_cache_hits == 12


def test_concurrent_sequences_hold_one_copy_of_the_shared_blocks() -> None:
    b = Batcher(_profile())
    b.add("a", 16, 50, 0.0, prefix_id="sys", prefix_tokens=12)
    b.step(0.0)  # a's prompt is computed and its 3 full prefix blocks registered
    b.add("b", 16, 50, 1.0, prefix_id="sys", prefix_tokens=12)
    b.step(1.0)
    sa, sb = b.seq_state("a"), b.seq_state("b")
    assert sa is not None and sb is not None
    assert sa.block_ids[:3] == sb.block_ids[:3]
    assert set(sa.block_ids[3:]).isdisjoint(sb.block_ids[3:])
    held = set(sa.block_ids) | set(sb.block_ids)
    assert b.used_blocks == len(held)
    pc = b.prefix_caching
    assert pc is not None and [pc.refcount(x) for x in sa.block_ids[:3]] == [2, 2, 2]


def test_other_traffic_evicts_a_cold_prefix() -> None:
    b = Batcher(_profile(blocks=8, max_model_len=32))
    b.add("a", 16, 1, 0.0, prefix_id="sys", prefix_tokens=16)
    _drain(b)
    b.add("x", 28, 4, 1.0)  # needs all 8 blocks: every cached block is reused
    _drain(b, 1.0)
    pc = b.prefix_caching
    assert pc is not None and pc.evictions == 4 and pc.num_cached == 0
    b.add("c", 16, 1, 9.0, prefix_id="sys", prefix_tokens=16)
    assert b.step(9.0).prefill_tokens == 16
    assert b.prefix_cache_hits == 0


def test_without_prefix_caching_prefixes_are_ignored() -> None:
    b = Batcher(_profile(enable_prefix_caching=False))
    b.add("a", 20, 1, 0.0, prefix_id="sys", prefix_tokens=12)
    _drain(b)
    b.add("b", 20, 1, 1.0, prefix_id="sys", prefix_tokens=12)
    assert b.step(1.0).prefill_tokens == 20
    assert b.prefix_cache_queries == b.prefix_cache_hits == 0
    assert b.prefix_caching is None


def test_prefix_longer_than_the_prompt_is_refused() -> None:
    from velvetrope.errors import PolicyError

    b = Batcher(_profile())
    with pytest.raises(PolicyError, match="prefix_tokens"):
        b.add("a", 8, 1, 0.0, prefix_id="sys", prefix_tokens=9)


# -- the invariant under random traffic ------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(1, 40),
            st.integers(1, 12),
            st.sampled_from(["p", "q", "r", None]),
            st.integers(0, 40),
        ),
        st.tuples(st.just("step"), st.just(0), st.just(0), st.none(), st.just(0)),
        st.tuples(st.just("abort"), st.integers(0, 30), st.just(0), st.none(), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, blocks=st.integers(13, 40))
def test_no_shared_block_is_freed_while_a_sequence_holds_it(
    ops: list[tuple[str, int, int, str | None, int]], blocks: int
) -> None:
    b = Batcher(_profile(blocks=blocks, max_model_len=blocks * BS, max_num_seqs=4))
    pc = b.prefix_caching
    assert pc is not None
    t, n = 0.0, 0
    for op, x, y, prefix, share in ops:
        if op == "add":
            b.add(f"s{n}", x, y, t, prefix_id=prefix, prefix_tokens=min(share, x))
            n += 1
        elif op == "abort":
            b.abort(f"s{x}")
        else:
            t = b.step(t).end
        tables = [b.seq_state(sid) for sid in b.seq_ids()]
        held: dict[int, int] = {}
        for s in tables:
            assert s is not None
            for blk in s.block_ids:
                held[blk] = held.get(blk, 0) + 1
        free = pc.free_ids()
        assert free.isdisjoint(held), "a held block is in the free queue"
        for blk, count in held.items():
            assert pc.refcount(blk) == count
        assert len(free) + len(held) == blocks
        assert b.used_blocks == len(held)
