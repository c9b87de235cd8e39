"""The Redis scripts' replies as the store's answers: grants, denials, snapshots, leases."""

from __future__ import annotations

from collections.abc import Sequence
from math import ldexp
from typing import Any

from velvetrope.core.bucket import BucketSnapshot, Claim, Denial, Grant
from velvetrope.store.base import LeaseAnswer

__all__ = ["parse_admit", "parse_lease", "parse_reserve", "snapshots"]

_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)


def parse_lease(r: Sequence[Any]) -> LeaseAnswer:
    """A lease script's reply."""
    return LeaseAnswer(int(r[0]) == 1, int(r[1]), int(r[2]))


def parse_admit(
    claims: Sequence[Claim], r: Sequence[Any]
) -> tuple[Grant | Denial, LeaseAnswer | None]:
    """The admit script's reply: the reservation, and the lease if one was asked for."""
    res = parse_reserve(claims, r[:-3])
    if isinstance(res, Denial):
        return res, None
    return res, parse_lease(r[-3:])


def parse_reserve(claims: Sequence[Claim], r: Sequence[Any]) -> Grant | Denial:
    """The reserve script's reply as a grant or a denial."""
    if int(r[0]) == 1:
        return _tuple(Grant, (tuple(claims), snapshots(claims, r, 1)))
    return Denial(float(r[1]), claims[int(r[2]) - 1].key, snapshots(claims, r, 3))


def snapshots(claims: Sequence[Claim], r: Sequence[Any], start: int) -> tuple[BucketSnapshot, ...]:
    """Snapshots from the levels at ``r[start:]``, each as the integers ``m, e`` of
    ``m * 2**e`` (one pair per claim); the time to full is derived here, as
    :meth:`~velvetrope.core.bucket.TokenBucket.time_to_full` does."""
    out = []
    for i, c in enumerate(claims):
        j = start + 2 * i
        level = ldexp(r[j], r[j + 1])
        reset = (c.capacity - level) / c.rate
        reset = reset if reset > 0.0 else 0.0
        out.append(_tuple(BucketSnapshot, (c.key, c.kind, c.owner, c.capacity, level, reset)))
    return tuple(out)
