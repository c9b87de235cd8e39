"""Calls packed from templates and cached numbers are the bytes ``pack`` (hiredis) writes
for the same arguments, call after call (a cache hit as much as a miss)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis

from velvetrope.core.bucket import Claim, settle_lines
from velvetrope.store.base import Slot
from velvetrope.store.redis_store import RedisStore, packed
from velvetrope.store.resp import arg, number, text
from velvetrope.store.wire import pack


def _stores() -> list[RedisStore]:
    client = redis.asyncio.Redis()  # never connected: nothing is sent
    return [
        RedisStore(client, namespace="ns"),
        RedisStore(client, namespace="n:é", shared_tag=True, lease_ttl_s=0.3, hold_ttl_s=7.5),
    ]


def _reference(script: Any, keys: list[Any], args: list[Any]) -> bytes:
    return pack(b"EVALSHA", script.sha, len(keys), *keys, *args)


CLAIMS = [
    [Claim("tenant:a:tok", "tokens", "tenant", 137.0, 1e12, 1e12 / 60)],
    [
        Claim("tenant:a:tok", "tokens", "tenant", 1 / 3, 1000, 10, 0.0),  # int shape
        Claim("tenant:a:req", "requests", "tenant", 1.0, 1e9, 1e9 / 60, -0.0),
        Claim("tier:gold:tok", "tokens", "tier", 30, 1000.0, 10.0, -250.5),  # int amount
    ],
    [Claim("model:m:tok", "tokens", "model", 0.0, 1000.0, 10.0, 0)],
]
AMOUNTS = [137.0, 1e-300, -0.0, 0.0, 0, 1, 2**70, math.inf, 16666666666.666666]
SLOTS = [Slot("default", 137, 4096, None), Slot("pool é", 0, 1, 2**40)]


@pytest.mark.parametrize("claims", CLAIMS, ids=["one", "three", "zeros"])
def test_reservations_pack_as_hiredis_does(claims: list[Claim]) -> None:
    for s in _stores():
        for i, amount in enumerate(AMOUNTS * 2):  # the second time from the caches
            cl = [c._replace(amount=amount) if j == 0 else c for j, c in enumerate(claims)]
            job = f"job-{i}" if i % 3 else f"jöb-{i}"
            for tenant in ("acme", "ténant"):
                want = _reference(s._reserve, *s._reserve_call(job, tenant, cl))
                assert s._packed_reserve(job, tenant, cl) == want
                for slot in SLOTS:
                    slot = slot._replace(tokens=i * 1000)
                    want = _reference(
                        s._reserve_leased, *s._reserve_leased_call(job, tenant, cl, slot)
                    )
                    assert s._packed_reserve(job, tenant, cl, slot) == want


def test_batched_settlements_pack_as_hiredis_does() -> None:
    claims = CLAIMS[1]
    jobs = [
        (f"j{i}", "acme", claims, settle_lines(claims, 7 * i))
        for i in range(5)  # float and int lines, bucket shapes repeated
    ]
    jobs.append(("j9", "acme", claims, (("tenant:a:tok", 30, 2**60), *settle_lines(claims, 0)[1:])))
    for s in _stores():
        for script, head, ids in (
            (s._finish_many, s._lease_keys("p"), True),
            (s._settle_many, [], False),
        ):
            for _ in range(2):
                keys, args = s._settle_many_call(jobs, list(head), ids)
                assert packed(script.sha, keys, args) == _reference(script, keys, args)


def test_numbers_keep_their_type_and_sign() -> None:
    for _ in range(2):
        assert [number(x) for x in (1, 1.0, -0.0, 0.0, 0, 2.5)] == [
            b"$1\r\n1\r\n",
            b"$3\r\n1.0\r\n",
            b"$4\r\n-0.0\r\n",
            b"$3\r\n0.0\r\n",
            b"$1\r\n0\r\n",
            b"$3\r\n2.5\r\n",
        ]
    with pytest.raises(TypeError, match="cannot send bool"):
        number(True)
    assert text("é") == b"$2\r\n\xc3\xa9\r\n"
    assert [arg(x) for x in ("é", "1", 1, 1.0)] == [text("é"), text("1"), number(1), number(1.0)]


def test_equal_shapes_of_other_types_share_a_template_and_its_bytes() -> None:
    """An int capacity and a float one, floors 0, 0.0 and -0.0: equal keys of the template
    cache, so the same arguments (as floats, a zero floor as 0.0) whichever came first."""
    a = Claim("tenant:a:tok", "tokens", "tenant", 5, 1000, 10, 0)
    b = Claim("tenant:a:tok", "tokens", "tenant", 5.0, 1000.0, 10.0, -0.0)
    c = b._replace(floor=0.0)
    for s in _stores():
        for claim in (a, b, c, a):
            want = _reference(s._reserve, *s._reserve_call("j", "acme", [claim]))
            assert s._packed_reserve("j", "acme", [claim]) == want
            assert b"1000.0" in want and b"-0.0" not in want
        assert len(s._templates) == 1
