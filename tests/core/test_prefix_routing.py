"""The prefix-aware replica choice (velvetrope.core.prefix_routing), with no I/O."""

from __future__ import annotations

import math
import random

import pytest

from velvetrope.core.policy import PolicyConfig
from velvetrope.core.pool_policy import PrefixRoutingPolicy
from velvetrope.core.prefix_routing import (
    KEPT,
    MISS,
    OVERRIDDEN,
    PrefixIndex,
    PrefixRouter,
    chain_hashes,
    prefix_routers,
)

NAMES = ["e0", "e1", "e2", "e3"]


def affinity(**kw: object) -> PrefixRouter:
    return PrefixRouter("prefix_affinity", PrefixRoutingPolicy.model_validate(kw))


def hashed(**kw: object) -> PrefixRouter:
    return PrefixRouter("prefix_hash", PrefixRoutingPolicy.model_validate(kw))


def test_chain_hashes_commit_to_every_earlier_block() -> None:
    a = chain_hashes(b"A" * 8 + b"B" * 8 + b"C" * 8, 8, 10)
    b = chain_hashes(b"A" * 8 + b"B" * 8 + b"D" * 8, 8, 10)
    c = chain_hashes(b"X" * 8 + b"B" * 8 + b"C" * 8, 8, 10)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert all(x != y for x, y in zip(a, c, strict=True))  # a different first block: all differ
    assert chain_hashes(b"A" * 8 + b"B" * 7, 8, 10) == a[:1]  # a partial block has no hash
    assert chain_hashes(b"A" * 80, 8, 3) == chain_hashes(b"A" * 80, 8, 10)[:3]
    assert chain_hashes(b"", 8, 3) == ()
    with pytest.raises(ValueError, match="block_bytes"):
        chain_hashes(b"x", 0, 3)


def test_index_matches_leading_runs_and_stays_bounded() -> None:
    idx = PrefixIndex(capacity=5, ways=2)
    idx.record([1, 2, 3], "e0")
    idx.record([1, 2], "e1")
    assert idx.depths([1, 2, 3, 4], {"e0": 0, "e1": 1}) == {"e0": 3, "e1": 2}
    assert idx.depths([1, 2, 3], {"e1": 1}) == {"e1": 2}  # only the engines asked about
    assert idx.depths([9, 1], {"e0": 0}) == {}  # a run starts at the first block
    idx.record([1], "e2")  # a third engine on block 1: the oldest (e0) drops out of it
    assert idx.depths([1, 2], {"e0": 0, "e1": 1, "e2": 2}) == {"e1": 2, "e2": 1}
    idx.record([10, 11, 12], "e3")  # 3 + 3 entries > 5: the least recently recorded goes
    assert len(idx) == 5
    assert idx.depths([3], {"e0": 0}) == {}  # block 3 was the least recently recorded
    assert idx.depths([2], {"e0": 0, "e1": 1}) == {"e1": 1, "e0": 1}
    idx.forget("e3")
    assert idx.depths([10], {"e3": 3}) == {} and len(idx) == 2


def test_affinity_sends_a_prefix_back_to_the_engine_that_computed_it() -> None:
    r = affinity()
    loads = [0, 0, 0, 0]
    first = r.choose([1, 2, 3], 128, NAMES, loads)
    assert first.outcome == MISS and first.matched == 0
    r.commit(first, [1, 2, 3], NAMES[first.at])
    loads[first.at] = 3  # busier than the rest, within the bound
    again = r.choose([1, 2, 3, 4], 128, NAMES, loads)
    assert again == (first.at, 3, KEPT)
    r.commit(again, [1, 2, 3, 4], NAMES[again.at])
    assert (r.kept, r.overridden, r.missed) == (1, 0, 1)
    assert (r.matched_blocks, r.hashed_blocks) == (3, 7)
    assert r.expected_hit_rate == pytest.approx(3 / 7)


def test_the_longest_match_wins_then_the_least_loaded() -> None:
    r = affinity()
    r.index.record([1, 2], "e0")
    r.index.record([1, 2, 3], "e2")
    r.index.record([1], "e3")
    assert r.choose([1, 2, 3], 128, NAMES, [0, 0, 1, 0]).at == 2
    r.index.record([1, 2, 3], "e1")
    assert r.choose([1, 2, 3], 128, NAMES, [0, 2, 1, 0]) == (2, 3, KEPT)  # e2 less loaded


def test_an_overloaded_match_is_passed_over_only_beyond_both_thresholds() -> None:
    r = affinity(balance_abs=4, balance_rel=2.0)
    r.index.record([1, 2, 3], "e0")
    r.index.record([1], "e1")
    # e0 at 9 vs least 2: 9 - 2 > 4 and 9 > 2 * 2: overridden, to the longest match within
    c = r.choose([1, 2, 3], 128, NAMES, [9, 3, 2, 2])
    assert c == (1, 1, OVERRIDDEN)
    # the absolute test alone does not pass it over: 9 - 5 = 4 is not > 4
    assert r.choose([1, 2, 3], 128, NAMES, [9, 5, 5, 5]) == (0, 3, KEPT)
    # nor the relative one alone: 13 - 7 > 4 but 13 is not > 2 * 7
    assert r.choose([1, 2, 3], 128, NAMES, [13, 7, 7, 7]) == (0, 3, KEPT)
    # with no other match the override goes to the least loaded
    c = r.choose([1, 2, 3], 128, ["e0", "e2", "e3", "e4"], [9, 3, 2, 5])
    assert c == (2, 0, OVERRIDDEN)


def test_only_eligible_engines_are_chosen() -> None:
    r = affinity()
    r.index.record([1, 2], "e0")
    c = r.choose([1, 2], 128, NAMES, [0, 5, 1, 0], lambda i: i != 0)
    assert c.at in (3,) and c.outcome == MISS
    assert r.choose([1, 2], 128, NAMES, [0, 0, 0, 0], lambda i: False).at == -1
    assert r.choose([], 128, NAMES, [4, 2, 1, 3]) == (2, 0, MISS)  # no block: least loaded


def test_an_oracle_replaces_the_index_and_nothing_is_learned() -> None:
    seen: list[int] = []

    def depths(hs: object, bt: int, engines: object) -> dict[str, int]:
        seen.append(bt)
        return {"e3": 2}

    r = PrefixRouter("prefix_affinity", PrefixRoutingPolicy(), depths)
    c = r.choose([1, 2], 512, NAMES, [0, 0, 0, 0])
    assert c == (3, 2, KEPT) and seen == [512]
    r.commit(c, [1, 2], "e3")
    assert len(r.index) == 0 and r.matched_blocks == 2


def test_hash_mode_agrees_across_replicas_and_needs_no_state() -> None:
    a, b = hashed(hash_tokens=256), hashed(hash_tokens=256)
    rng = random.Random(7)
    for _ in range(200):
        hs = [rng.getrandbits(64) for _ in range(rng.randint(2, 6))]
        ca = a.choose(hs, 128, NAMES, [0, 0, 0, 0])
        assert ca == b.choose(hs, 128, NAMES, [0, 0, 0, 0]) and ca.outcome == KEPT
        # only the first hash_tokens // block_tokens = 2 blocks key it
        assert a.choose([*hs[:2], 99, 98], 128, NAMES, [0, 0, 0, 0]).at == ca.at
    assert len(a.index) == 0


def test_hash_mode_spreads_keys_and_moves_only_a_removed_engines_keys() -> None:
    r = hashed()
    rng = random.Random(3)
    keys = [[rng.getrandbits(64)] for _ in range(2000)]
    picks = [r.choose(k, 128, NAMES, [0] * 4).at for k in keys]
    counts = [picks.count(i) for i in range(4)]
    assert min(counts) > 400  # about 500 each
    fewer = [r.choose(k, 128, NAMES[:3], [0] * 3).at for k in keys]
    for before, after in zip(picks, fewer, strict=True):
        if before != 3:
            assert after == before  # rendezvous: the other engines keep their keys


def test_hash_mode_bounds_the_load() -> None:
    r = hashed(load_factor=1.25)
    loads = [0, 0, 0, 0]
    hs = [42]  # one hot key
    for _ in range(40):
        c = r.choose(hs, 128, NAMES, loads)
        total = sum(loads)
        assert loads[c.at] + 1 <= math.ceil(1.25 * (total + 1) / 4)
        r.commit(c, hs, NAMES[c.at])
        loads[c.at] += 1
    assert max(loads) <= math.ceil(1.25 * 40 / 4)
    assert r.kept >= 1 and r.overridden >= 1 and r.kept + r.overridden == 40


def test_routers_are_made_for_prefix_pools_only() -> None:
    cfg = PolicyConfig.model_validate(
        {
            "pools": [
                {"name": "a"},
                {"name": "b", "routing": "prefix_affinity", "prefix": {"balance_abs": 2}},
                {"name": "c", "routing": "prefix_hash"},
            ]
        }
    )
    routers = prefix_routers(cfg)
    assert set(routers) == {"b", "c"}
    assert routers["b"].mode == "prefix_affinity" and routers["b"].settings.balance_abs == 2
    assert routers["c"].mode == "prefix_hash"
    with pytest.raises(ValueError, match="unknown prefix routing mode"):
        PrefixRouter("least_loaded", PrefixRoutingPolicy())
