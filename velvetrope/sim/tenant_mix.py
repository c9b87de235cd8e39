"""Tenant mixes: which tenant (and tier) each request of a synthetic workload is.

A bad mix raises :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from velvetrope import checks
from velvetrope.errors import PolicyError
from velvetrope.sim.seeds import Seed, as_generator
from velvetrope.sim.trace_request import FloatArray, IntArray, TraceRequest

__all__ = ["TenantMix"]


@dataclass(frozen=True, slots=True, init=False)
class TenantMix:
    """Tenants (each with an optional tier) and their shares of the traffic.

    ``TenantMix([("gold", "tier-1", 0.2), ("silver", "tier-2", 0.3), ("bronze", None, 0.5)])``
    or ``TenantMix.parse("gold:tier-1:0.2,silver:tier-2:0.3,bronze:0.5")``.  Weights are
    finite and ``> 0`` and are normalised to sum to 1; tenant names are unique.  Each request
    is assigned independently (a categorical draw), so shares are exact only in expectation.
    """

    entries: tuple[tuple[str, str | None, float], ...]
    _cum: FloatArray = field(repr=False, compare=False)

    def __init__(self, entries: Iterable[tuple[str, str | None, float]]) -> None:
        items = list(entries)
        if not items:
            raise PolicyError("a tenant mix needs at least one tenant")
        seen: set[str] = set()
        norm: list[tuple[str, str | None, float]] = []
        total = 0.0
        for entry in items:
            if not isinstance(entry, tuple) or len(entry) != 3:
                raise PolicyError(f"tenant mix entries are (tenant, tier, weight), got {entry!r}")
            tenant, tier, weight = entry
            if not isinstance(tenant, str) or not tenant:
                raise PolicyError(f"tenant must be a non-empty string, got {tenant!r}")
            if tier is not None and (not isinstance(tier, str) or not tier):
                raise PolicyError(f"tier of {tenant!r} must be a non-empty string or None")
            if tenant in seen:
                raise PolicyError(f"tenant {tenant!r} appears twice in the mix")
            seen.add(tenant)
            w = checks.number(f"weight of {tenant!r}", weight)
            total += w
            norm.append((tenant, tier, w))
        shares = tuple((tn, tr, w / total) for tn, tr, w in norm)
        cum = np.cumsum([s for _, _, s in shares])
        cum[-1] = 1.0
        object.__setattr__(self, "entries", shares)
        object.__setattr__(self, "_cum", cum)

    @classmethod
    def parse(cls, text: str) -> TenantMix:
        """Parse ``tenant[:tier]:weight`` items separated by commas.

        ``"gold:tier-1:0.2,silver:tier-2:0.3,bronze:tier-3:0.5"``; whitespace around items and
        fields is ignored; ``"batch:1"`` gives a tenant with no tier.  A malformed item raises
        :class:`~velvetrope.errors.PolicyError` naming it.
        """
        if not isinstance(text, str) or not text.strip():
            raise PolicyError("empty tenant mix; expected e.g. 'gold:tier-1:0.2,bronze:0.8'")
        entries: list[tuple[str, str | None, float]] = []
        for raw in text.split(","):
            item = raw.strip()
            fields = [f.strip() for f in item.split(":")]
            if len(fields) not in (2, 3) or not all(fields):
                raise PolicyError(
                    f"bad tenant mix item {item!r} in {text!r}: expected tenant[:tier]:weight"
                )
            try:
                weight = float(fields[-1])
            except ValueError:
                raise PolicyError(
                    f"bad weight {fields[-1]!r} in tenant mix item {item!r}: not a number"
                ) from None
            tier = fields[1] if len(fields) == 3 else None
            entries.append((fields[0], tier, weight))
        return cls(entries)

    def __str__(self) -> str:
        """The :meth:`parse` form, with normalised weights."""
        parts = []
        for tenant, tier, share in self.entries:
            head = f"{tenant}:{tier}" if tier is not None else tenant
            parts.append(f"{head}:{share:.6g}")
        return ",".join(parts)

    @property
    def tenants(self) -> tuple[str, ...]:
        """Tenant names, in the order given."""
        return tuple(e[0] for e in self.entries)

    def shares(self) -> dict[str, float]:
        """Each tenant's normalised share."""
        return {tenant: share for tenant, _, share in self.entries}

    def draw(self, rng: np.random.Generator, n: int) -> IntArray:
        """Indices into :attr:`entries` for ``n`` requests, each drawn by weight."""
        u = rng.random(checks.count("n", n, 0))
        return np.searchsorted(self._cum, u, side="right").astype(np.int64)

    def assign(self, requests: Sequence[TraceRequest], seed: Seed) -> list[TraceRequest]:
        """A copy of ``requests`` with tenant and tier replaced by draws from the mix.

        Times, token counts and ``max_tokens`` are kept; the same seed gives the same
        assignment.
        """
        idx = self.draw(as_generator(seed), len(requests))
        out: list[TraceRequest] = []
        for r, i in zip(requests, idx.tolist(), strict=True):
            tenant, tier, _ = self.entries[i]
            out.append(replace(r, tenant=tenant, tier=tier))
        return out
