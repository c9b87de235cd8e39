"""What a simulated run measured, per request and per tier, and the definitions behind it.

Per request (:class:`JobRecords`): arrival, dispatch, first-token and end times, terminal
state and reason, tenant, tier and sizes.  Per tier (:func:`summarize`):

* **TTFT** = first token − arrival, **e2e** = end − arrival, **queue wait** = dispatch −
  arrival, over *completed* requests; **TPOT** = (end − first token) / (output − 1) over
  completed requests with at least two output tokens.  Percentiles interpolate linearly
  (numpy's default); an empty set gives ``nan``.
* **Goodput**: a request counts when it *completed* and met every bound of its tier's
  :class:`~velvetrope.core.policy.SloPolicy` (:func:`within_slo`): TTFT ≤ ``ttft_s``,
  TPOT ≤ ``tpot_s`` (a one-token answer has no TPOT and passes), e2e ≤ ``e2e_s``; a bound
  that is ``None`` is not checked.  Rejected, expired,
  cancelled and failed requests never count.  Reported as a fraction of the tier's offered
  requests and as good requests per second of the run's span.
* **Outcomes by reason**: the terminal reason of every request that did not complete
  (``rate_limited``, ``queue_full``, ``wait_exceeds_slo``, ``expired``, ``cancelled``,
  ``upstream_error``, ...), counted.
* **Jain's fairness index** across tenants: ``J = (Σx)² / (n·Σx²)`` over the tenants'
  *served fractions* ``x_i`` = tokens (prompt + output) of tenant i's completed requests /
  tokens of all its offered requests.  1 when every tenant got the same share of what it
  asked for, ``1/n`` when one tenant got everything.  Per tier it is taken over the tenants
  of that tier; the ``all`` row over every tenant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from velvetrope.core.policy import PolicyConfig, SloPolicy
from velvetrope.errors import PolicyError

__all__ = [
    "ALL",
    "DEFAULT_SLO",
    "JobRecords",
    "Quantiles",
    "TierStats",
    "config_slos",
    "goodput_mask",
    "jain_index",
    "parse_slo",
    "percentiles",
    "slo_for",
    "slo_text",
    "summarize",
    "within_slo",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

ALL = "all"
"""Name of the summary row over every tier."""


def slo_text(slo: SloPolicy | None) -> str:
    """``TTFT ≤ 2 s, TPOT ≤ 0.1 s`` (the bounds that are set), ``none``, or ``""`` for no SLO."""
    if slo is None:
        return ""
    parts = [
        f"{label} ≤ {v:g} s"
        for label, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s), ("e2e", slo.e2e_s))
        if v is not None
    ]
    return ", ".join(parts) if parts else "none"


DEFAULT_SLO = SloPolicy(ttft_s=2.0, tpot_s=0.1)
"""TTFT ≤ 2 s and TPOT ≤ 100 ms (10 tokens/s, faster than people read): the default of
every tier that no ``--slo`` names."""

_SLO_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def parse_slo(text: str) -> tuple[str, SloPolicy]:
    """Parse ``TIER=ttft:2,tpot:0.1,e2e:30`` (any subset; ``TIER`` may be ``*``).

    Bounds not named are unchecked (``None``); each named one must be finite and > 0.
    Returns ``(tier, slo)``; raises :class:`~velvetrope.errors.PolicyError`.
    """
    tier, eq, spec = text.partition("=")
    tier = tier.strip()
    if not eq or not tier or not spec.strip():
        raise PolicyError(f"bad SLO {text!r}: expected TIER=ttft:SECONDS[,tpot:S][,e2e:S]")
    kw: dict[str, float] = {}
    for item in spec.split(","):
        key, colon, val = item.strip().partition(":")
        field = _SLO_KEYS.get(key.strip().lower())
        if field is None or not colon:
            raise PolicyError(f"bad SLO item {item!r} in {text!r}; keys: ttft, tpot, e2e")
        try:
            v = float(val)
        except ValueError:
            raise PolicyError(f"bad SLO value {val!r} in {text!r}: not a number") from None
        if not (math.isfinite(v) and v > 0):
            raise PolicyError(f"bad SLO value {val!r} in {text!r}: must be finite and > 0")
        kw[field] = v
    return tier, SloPolicy.model_validate(kw)


def config_slos(policy: PolicyConfig) -> dict[str, SloPolicy]:
    """The SLOs the policy's tiers declare (``tiers[].slo``), by tier name."""
    return {t.name: t.slo for t in policy.tiers if t.slo is not None}


def slo_for(tier: str, slos: Mapping[str, SloPolicy]) -> SloPolicy:
    """The SLO of ``tier``: its own, else the ``*`` entry, else :data:`DEFAULT_SLO`."""
    return slos.get(tier) or slos.get("*") or DEFAULT_SLO


def percentiles(values: Sequence[float] | FloatArray, qs: Iterable[float]) -> tuple[float, ...]:
    """The ``qs`` percentiles (0–100) of ``values``, linear interpolation; ``nan`` if empty."""
    q = list(qs)
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return tuple(math.nan for _ in q)
    return tuple(float(v) for v in np.percentile(arr, q))


def jain_index(values: Sequence[float] | FloatArray) -> float:
    """Jain's fairness index ``(Σx)² / (n·Σx²)`` of non-negative ``values``.

    In ``[1/n, 1]``; 1 when all are equal (all zero included); ``nan`` for no values.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan
    if bool(np.any(x < 0)) or not bool(np.all(np.isfinite(x))):
        raise PolicyError("Jain's index needs finite, non-negative values")
    sq = float(np.dot(x, x))
    if sq == 0.0:
        return 1.0
    return float(x.sum()) ** 2 / (x.size * sq)


@dataclass(frozen=True, slots=True, eq=False)
class JobRecords:
    """Per-request results of a run, as aligned arrays in arrival order.

    Times are seconds on the run's clock, ``nan`` where the event did not happen
    (``dispatched`` for a request never dispatched, ``first_token`` for one that produced
    none).  ``end`` is the time of the terminal state.  ``state`` and ``reason`` are the
    core's :class:`~velvetrope.core.lifecycle.JobState` value and
    :class:`~velvetrope.core.lifecycle.Reason` code; ``output`` is the output length the
    engine generated (or would have): the true length, or the capped ``max_tokens`` of a
    degraded request; ``predicted`` the prediction the core used; ``pool`` where the core
    routed it, ``route`` the reason code of that choice (the rule's name or ``default``)
    and ``degraded`` its degradation actions, comma-separated (empty: none).
    """

    arrival: FloatArray
    dispatched: FloatArray
    first_token: FloatArray
    end: FloatArray
    state: NDArray[np.str_]
    reason: NDArray[np.str_]
    tenant: NDArray[np.str_]
    tier: NDArray[np.str_]
    prompt: IntArray
    output: IntArray
    predicted: IntArray
    pool: NDArray[np.str_] | None = None
    route: NDArray[np.str_] | None = None
    degraded: NDArray[np.str_] | None = None
    shadow: NDArray[np.str_] | None = None
    """Shadow mode (``enforce: false``): ``decision`` or ``decision reason`` as
    enforcement would have decided (empty: the request was enforced)."""
    endpoint: NDArray[np.str_] | None = None
    """The endpoint kind of each request (``chat``, ``embeddings``, ...; ``None``: all
    ``chat``).  A prompt-only request's ``output`` is 0 and its first token its end."""

    def __len__(self) -> int:
        return int(self.arrival.size)

    @property
    def completed(self) -> NDArray[np.bool_]:
        done: NDArray[np.bool_] = np.equal(self.state, "completed")
        return done

    def shadow_counts(self, by_endpoint: bool = False) -> dict[tuple[str, ...], int]:
        """Shadow decisions by ``(tier, decision, reason)``, and the endpoint kind last with
        ``by_endpoint`` (the gateway's ``velvetrope_shadow_decisions_total``)."""
        out: dict[tuple[str, ...], int] = {}
        if self.shadow is None:
            return out
        kinds = self.endpoint.tolist() if self.endpoint is not None else None
        for i, (tier, said) in enumerate(
            zip(self.tier.tolist(), self.shadow.tolist(), strict=True)
        ):
            if said:
                decision, _, reason = said.partition(" ")
                key: tuple[str, ...] = (tier, decision, reason)
                if by_endpoint:
                    key += (kinds[i] if kinds is not None else "chat",)
                out[key] = out.get(key, 0) + 1
        return out

    def endpoint_counts(self) -> dict[str, tuple[int, int]]:
        """Requests and completed requests by endpoint kind (the gateway's
        ``velvetrope_requests_total{endpoint}``); empty when every request is a chat."""
        kinds = self.endpoint
        if kinds is None or not np.any(kinds != "chat"):
            return {}
        done = self.completed
        return {
            k: (int(np.sum(kinds == k)), int(np.sum(done & (kinds == k))))
            for k in sorted(set(kinds.tolist()))
        }

    def ttft(self) -> FloatArray:
        return self.first_token - self.arrival

    def e2e(self) -> FloatArray:
        return self.end - self.arrival

    def queue_wait(self) -> FloatArray:
        return self.dispatched - self.arrival

    def tpot(self) -> FloatArray:
        """Per request; ``nan`` with fewer than two output tokens."""
        steps = (self.output - 1).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(steps > 0, (self.end - self.first_token) / steps, np.nan)


def within_slo(slo: SloPolicy, ttft: FloatArray, tpot: FloatArray, e2e: FloatArray) -> BoolArray:
    """Which requests met every bound ``slo`` sets, given their TTFT, TPOT and e2e latency
    (aligned arrays, seconds; a ``nan`` TPOT, a one-token answer, passes).  The one
    definition of "within SLO": the simulator's goodput and the demo's both use it."""
    ok: BoolArray = np.ones(np.shape(ttft), dtype=bool)
    if slo.ttft_s is not None:
        ok &= ttft <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= np.isnan(tpot) | (tpot <= slo.tpot_s)
    if slo.e2e_s is not None:
        ok &= e2e <= slo.e2e_s
    return ok


def goodput_mask(rec: JobRecords, slos: Mapping[str, SloPolicy]) -> BoolArray:
    """Which requests count toward goodput: completed and :func:`within_slo` of their
    tier (see the module docstring)."""
    good = rec.completed.copy()
    ttft, tpot, e2e = rec.ttft(), rec.tpot(), rec.e2e()
    for tier in np.unique(rec.tier).tolist():
        sel = rec.tier == tier
        good[sel] &= within_slo(slo_for(tier, slos), ttft[sel], tpot[sel], e2e[sel])
    return good


Quantiles = tuple[float, float, float]
"""p50, p90, p99."""

_QS = (50.0, 90.0, 99.0)


@dataclass(frozen=True, slots=True)
class TierStats:
    """One row of the per-tier table (``tier == "all"`` for the whole run).

    Latencies in seconds; ``outcomes`` maps each non-completed terminal reason to its count.
    """

    tier: str
    slo: SloPolicy | None
    offered: int
    completed: int
    good: int
    goodput_frac: float
    goodput_rps: float
    ttft: Quantiles
    tpot: Quantiles
    e2e: Quantiles
    queue: Quantiles
    ttft_mean: float
    e2e_mean: float
    outcomes: dict[str, int]
    jain: float


def _q(x: FloatArray) -> Quantiles:
    a, b, c = percentiles(x[~np.isnan(x)], _QS)
    return a, b, c


def _mean(x: FloatArray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def _served_fractions(rec: JobRecords, sel: NDArray[np.bool_]) -> list[float]:
    tokens = (rec.prompt + rec.output).astype(np.float64)
    done = rec.completed
    out = []
    for tenant in np.unique(rec.tenant[sel]).tolist():
        mine = sel & (rec.tenant == tenant)
        asked = float(tokens[mine].sum())
        out.append(float(tokens[mine & done].sum()) / asked if asked > 0 else 0.0)
    return out


def summarize(
    rec: JobRecords, slos: Mapping[str, SloPolicy], span_s: float, tiers: Sequence[str]
) -> list[TierStats]:
    """One :class:`TierStats` per tier of ``tiers`` that has requests, then the ``all`` row."""
    good = goodput_mask(rec, slos)
    done = rec.completed
    ttft, tpot, e2e, queue = rec.ttft(), rec.tpot(), rec.e2e(), rec.queue_wait()
    rows = []
    present = set(np.unique(rec.tier).tolist())
    groups: list[tuple[str, NDArray[np.bool_]]] = [
        (t, rec.tier == t) for t in tiers if t in present
    ]
    groups.append((ALL, np.ones(len(rec), dtype=bool)))
    for name, sel in groups:
        n = int(sel.sum())
        ok = sel & done
        reasons, counts = np.unique(rec.reason[sel & ~done], return_counts=True)
        n_good = int((sel & good).sum())
        rows.append(
            TierStats(
                tier=name,
                slo=None if name == ALL else slo_for(name, slos),
                offered=n,
                completed=int(ok.sum()),
                good=n_good,
                goodput_frac=n_good / n if n else math.nan,
                goodput_rps=n_good / span_s if span_s > 0 else math.nan,
                ttft=_q(ttft[ok]),
                tpot=_q(tpot[ok]),
                e2e=_q(e2e[ok]),
                queue=_q(queue[ok]),
                ttft_mean=_mean(ttft[ok]),
                e2e_mean=_mean(e2e[ok]),
                outcomes=dict(zip(reasons.tolist(), counts.tolist(), strict=True)),
                jain=jain_index(_served_fractions(rec, sel)) if n else math.nan,
            )
        )
    return rows
