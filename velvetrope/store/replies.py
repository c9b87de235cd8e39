"""The Redis scripts' replies as the store's answers: grants, denials, snapshots, leases,
and which error replies mean the call itself was refused."""

from __future__ import annotations

import re
from collections.abc import Sequence
from math import ldexp
from typing import Any

from redis.exceptions import ResponseError

from velvetrope.core.bucket import BucketSnapshot, Claim, Denial, Grant, time_to_full
from velvetrope.core.tuples import new_tuple
from velvetrope.store.base import LeaseAnswer

__all__ = ["parse_lease", "parse_reserve", "parse_reserve_leased", "refused", "snapshots"]


def parse_lease(r: Sequence[Any], start: int = 0) -> LeaseAnswer:
    """A lease script's reply (at ``r[start:]``: three integers)."""
    granted: int = r[start]  # typed: compiled, an unboxing, not a call of int()
    in_flight: int = r[start + 1]
    tokens: int = r[start + 2]
    return new_tuple(LeaseAnswer, (granted == 1, in_flight, tokens))


def parse_reserve_leased(
    claims: Sequence[Claim], r: Sequence[Any]
) -> tuple[Grant | Denial, LeaseAnswer | None]:
    """The reserve_leased script's reply: the reservation, and the lease if one was asked for (its
    last three items; the reservation's reader stops before them)."""
    res = parse_reserve(claims, r)
    if isinstance(res, Denial):
        return res, None
    return res, parse_lease(r, len(r) - 3)


def parse_reserve(claims: Sequence[Claim], r: Sequence[Any]) -> Grant | Denial:
    """The reserve script's reply as a grant or a denial."""
    granted: int = r[0]
    if granted == 1:
        return new_tuple(Grant, (tuple(claims), snapshots(claims, r, 1)))
    return Denial(float(r[1]), claims[int(r[2]) - 1].key, snapshots(claims, r, 3))


def snapshots(claims: Sequence[Claim], r: Sequence[Any], start: int) -> tuple[BucketSnapshot, ...]:
    """Snapshots from the levels at ``r[start:]``, each as the integers ``m, e`` of
    ``m * 2**e`` (one pair per claim); the time to full is derived here, as
    :meth:`~velvetrope.core.bucket.TokenBucket.time_to_full` does."""
    out = []
    for i, c in enumerate(claims):
        j = start + 2 * i
        level = ldexp(r[j], r[j + 1])
        reset = time_to_full(c.capacity, level, c.rate)
        out.append(new_tuple(BucketSnapshot, (c.key, c.kind, c.owner, c.capacity, level, reset)))
    return tuple(out)


_PASSING = re.compile(r"\b(BUSY|OOM|LOADING|READONLY|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|NOSCRIPT)\b")


def refused(e: BaseException) -> bool:
    """Whether ``e`` is Redis refusing the call for what it carries (a script's runtime
    error, a key of another type), which sending it again would meet again: an error reply
    that names no passing server state (busy with a script, out of memory, loading, a
    replica, a cluster or master down; redis-py raises most of those as subclasses).
    Connection errors and timeouts are not refusals."""
    return type(e) is ResponseError and _PASSING.search(str(e).upper()) is None
