"""Workloads: the request record, length models, tenant mixes, transforms and statistics.

A workload is a plain ``list[TraceRequest]`` sorted by arrival time ``t``.  Recorded traces
come from :mod:`velvetrope.sim.traces`, arrival times of synthetic ones from
:mod:`velvetrope.sim.arrivals`; this module owns everything in between:

* :class:`TraceRequest`, the record that the simulator and the demo's load generator consume;
* length models (:class:`Fixed`, :class:`Exponential`, :class:`LogNormal`, :class:`Empirical`
  per dimension, or :class:`TraceLengths` for joint prompt/output pairs of a trace) and
  :func:`synthesize`, which puts arrival times, lengths and a tenant mix together;
* :class:`TenantMix`, which assigns requests to tenants and tiers by weight;
* transforms that keep a workload sorted: :func:`rescale_time`, :func:`scale_to_rate`,
  :func:`head`, :func:`time_window`, :func:`merge`;
* :func:`trace_stats` and :func:`index_of_dispersion`.

Everything random takes a seed (an ``int`` or a :class:`numpy.random.Generator`): the same
seed gives the same workload, on every run.  Bad parameters raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeAlias

import numpy as np
from numpy.typing import NDArray

from velvetrope import checks
from velvetrope.core.kinds import PROMPT_ONLY, SIMULATED
from velvetrope.errors import PolicyError

__all__ = [
    "Empirical",
    "Exponential",
    "Fixed",
    "IndependentLengths",
    "LengthDist",
    "LengthModel",
    "LogNormal",
    "Seed",
    "TenantMix",
    "TraceLengths",
    "TraceRequest",
    "TraceStats",
    "as_generator",
    "head",
    "index_of_dispersion",
    "merge",
    "rescale_time",
    "scale_to_rate",
    "synthesize",
    "time_window",
    "trace_stats",
]

Seed: TypeAlias = int | np.random.Generator
"""A seed for :func:`numpy.random.default_rng`, or a generator to draw from (and advance)."""

IntArray: TypeAlias = NDArray[np.int64]
FloatArray: TypeAlias = NDArray[np.float64]

# Standard normal quantile at 0.99: Φ⁻¹(0.99).
_Z99 = 2.3263478740408408


def as_generator(seed: Seed) -> np.random.Generator:
    """Return ``seed`` itself if it is a generator, else ``numpy.random.default_rng(seed)``.

    Passing a generator shares its stream (the caller's generator advances); passing an int
    gives a fresh, reproducible stream.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PolicyError(f"seed must be an int or a numpy Generator, got {seed!r}")
    if seed < 0:
        raise PolicyError(f"seed must be >= 0, got {seed}")
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload: when it arrives, how big it is, whose it is.

    ``t`` is the arrival time in seconds from the start of the workload (finite, ``>= 0``):
    an Azure CSV trace is rebased so that its first row is at ``0.0``; a JSONL file keeps the
    times it holds; synthetic arrivals start after 0.  ``prompt_tokens >= 1``;
    ``output_tokens >= 0`` is the true output length, what the engine will generate (``0`` is
    a prefill-only request, which some traces record).
    ``max_tokens`` is the declared ``max_tokens`` (``None``: not declared); when declared it is
    ``>= 1`` and ``>= output_tokens``, since an engine stops at ``max_tokens``.  ``tenant`` is a
    non-empty name, ``tier`` a non-empty name or ``None`` (the tenant's configured tier).
    ``prefix_id``/``prefix_tokens``: the first ``prefix_tokens`` prompt tokens are the shared
    prefix ``prefix_id`` (a system prompt; reused by an engine with prefix caching);
    ``0 <= prefix_tokens <= prompt_tokens``, and a positive count needs an id.  ``model`` is
    the requested model (``None``: unnamed; routing rules on models see it).
    ``block_hashes``/``block_tokens``: the prompt's leading blocks of ``block_tokens`` tokens
    each, as chained hashes (equal hash at the same position: the same prefix up to the end
    of that block, as in Mooncake's ``hash_ids``); prefix-aware routing keys on them and an
    engine with prefix caching reuses them.  Hashes need ``block_tokens >= 1``.
    ``endpoint`` is the endpoint kind (:data:`~velvetrope.core.kinds.SIMULATED`: ``chat``, the
    default, ``completions``, ``responses``, ``messages``, ``embeddings`` or ``rerank``);
    a prompt-only kind (``embeddings``, ``rerank``) has ``output_tokens`` 0 and no
    ``max_tokens``, and is admitted as the gateway admits it
    (:func:`~velvetrope.core.kinds.size_prompt_only`).

    Construction validates and normalises (numpy scalars become ``int``/``float``); a bad field
    raises :class:`~velvetrope.errors.PolicyError`.
    """

    t: float
    prompt_tokens: int
    output_tokens: int
    tenant: str = "default"
    tier: str | None = None
    max_tokens: int | None = None
    prefix_id: str | None = None
    prefix_tokens: int = 0
    model: str | None = None
    block_hashes: tuple[int, ...] = ()
    block_tokens: int = 0
    endpoint: str = "chat"

    def __post_init__(self) -> None:
        t = self.t
        if isinstance(t, bool) or not isinstance(t, int | float):
            raise PolicyError(f"t must be a number of seconds, got {t!r}")
        try:
            t = float(t)
        except OverflowError:
            t = math.inf
        if not (math.isfinite(t) and t >= 0.0):
            raise PolicyError(f"t must be finite and >= 0, got {self.t!r}")
        object.__setattr__(self, "t", t)
        object.__setattr__(
            self, "prompt_tokens", checks.count("prompt_tokens", self.prompt_tokens, 1)
        )
        output = checks.count("output_tokens", self.output_tokens, 0)
        object.__setattr__(self, "output_tokens", output)
        if not isinstance(self.tenant, str) or not self.tenant:
            raise PolicyError(f"tenant must be a non-empty string, got {self.tenant!r}")
        if self.tier is not None and (not isinstance(self.tier, str) or not self.tier):
            raise PolicyError(f"tier must be a non-empty string or None, got {self.tier!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise PolicyError(f"model must be a non-empty string or None, got {self.model!r}")
        if self.max_tokens is not None:
            cap = checks.count("max_tokens", self.max_tokens, 1)
            if output > cap:
                raise PolicyError(f"output_tokens ({output}) exceeds max_tokens ({cap})")
            object.__setattr__(self, "max_tokens", cap)
        shared = checks.count("prefix_tokens", self.prefix_tokens, 0)
        if shared > self.prompt_tokens or (shared and not self.prefix_id):
            raise PolicyError(
                f"prefix_tokens ({shared}) must be <= prompt_tokens ({self.prompt_tokens}) "
                f"and need a non-empty prefix_id (got {self.prefix_id!r})"
            )
        object.__setattr__(self, "prefix_tokens", shared)
        if self.endpoint not in SIMULATED:
            raise PolicyError(
                f"endpoint must be one of {', '.join(SIMULATED)}, got {self.endpoint!r}"
            )
        if self.endpoint in PROMPT_ONLY and (output or self.max_tokens is not None):
            raise PolicyError(
                f"a {self.endpoint} request is prompt-only: output_tokens must be 0 and "
                f"max_tokens null (got {output}, {self.max_tokens})"
            )
        if self.block_hashes or self.block_tokens:
            hashes = self.block_hashes
            if not isinstance(hashes, tuple) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes
            ):
                raise PolicyError(f"block_hashes must be a tuple of integers, got {hashes!r}")
            checks.count("block_tokens", self.block_tokens, 1 if hashes else 0)


def _columns(requests: Sequence[TraceRequest]) -> tuple[FloatArray, IntArray, IntArray]:
    n = len(requests)
    t = np.fromiter((r.t for r in requests), dtype=np.float64, count=n)
    p = np.fromiter((r.prompt_tokens for r in requests), dtype=np.int64, count=n)
    o = np.fromiter((r.output_tokens for r in requests), dtype=np.int64, count=n)
    return t, p, o


def _check_sorted(requests: Sequence[TraceRequest], what: str) -> None:
    for i in range(1, len(requests)):
        if requests[i].t < requests[i - 1].t:
            raise PolicyError(
                f"{what}: requests must be sorted by t; request {i} at t={requests[i].t!r} "
                f"comes after t={requests[i - 1].t!r}"
            )


# --------------------------------------------------------------------------- lengths


class LengthDist(Protocol):
    """A distribution of token counts for one dimension (prompt or output)."""

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        """Draw ``n`` token counts (``int64``, each ``>= 1``) from ``rng``."""
        ...


def _bounds(lo: int, hi: int | None) -> tuple[int, int | None]:
    lo = checks.count("lo", lo, 1)
    if hi is not None:
        hi = checks.count("hi", hi, 1)
        if hi < lo:
            raise PolicyError(f"hi ({hi}) must be >= lo ({lo})")
    return lo, hi


@dataclass(frozen=True, slots=True)
class Fixed:
    """Every request has exactly ``n >= 1`` tokens."""

    n: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", checks.count("n", self.n, 1))

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        return np.full(checks.count("n", n, 0), self.n, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Exponential:
    """The discrete exponential: geometric on ``{1, 2, ...}`` with mean ``mean >= 1``.

    Samples are clipped to ``[lo, hi]`` (``hi=None``: unbounded), which moves the mean a little
    when the bounds bite.  Its squared coefficient of variation is ``1 - 1/mean``.
    """

    mean: float
    lo: int = 1
    hi: int | None = None

    def __post_init__(self) -> None:
        mean = checks.number("mean", self.mean)
        if mean < 1.0:
            raise PolicyError(f"mean must be >= 1 token, got {self.mean!r}")
        object.__setattr__(self, "mean", mean)
        lo, hi = _bounds(self.lo, self.hi)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        x = rng.geometric(1.0 / self.mean, size=checks.count("n", n, 0)).astype(np.int64)
        return np.clip(x, self.lo, self.hi)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A lognormal in tokens, ``exp(N(mu, sigma²))`` rounded to the nearest integer.

    Build it from the percentiles one usually knows with :meth:`from_percentiles`.  Samples
    are clipped to ``[lo, hi]`` (``hi=None``: unbounded; set it to the model's context length).
    """

    mu: float
    sigma: float
    lo: int = 1
    hi: int | None = None

    def __post_init__(self) -> None:
        for name in ("mu", "sigma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise PolicyError(f"{name} must be a finite number, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.sigma < 0.0:
            raise PolicyError(f"sigma must be >= 0, got {self.sigma!r}")
        lo, hi = _bounds(self.lo, self.hi)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @classmethod
    def from_percentiles(
        cls, p50: float, p99: float, *, lo: int = 1, hi: int | None = None
    ) -> LogNormal:
        """The lognormal whose median is ``p50`` and 99th percentile ``p99`` (``p99 >= p50``).

        ``mu = ln p50`` and ``sigma = (ln p99 - ln p50) / z_0.99`` with ``z_0.99 ≈ 2.326``.
        """
        p50 = checks.number("p50", p50)
        p99 = checks.number("p99", p99)
        if p99 < p50:
            raise PolicyError(f"p99 ({p99}) must be >= p50 ({p50})")
        return cls(math.log(p50), (math.log(p99) - math.log(p50)) / _Z99, lo=lo, hi=hi)

    @property
    def p50(self) -> float:
        """The median before rounding and clipping."""
        return math.exp(self.mu)

    @property
    def p99(self) -> float:
        """The 99th percentile before rounding and clipping."""
        return math.exp(self.mu + _Z99 * self.sigma)

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        x = np.rint(rng.lognormal(self.mu, self.sigma, size=checks.count("n", n, 0)))
        # Clip in float first: a far tail can exceed int64.
        upper = float(self.hi) if self.hi is not None else 2.0**62
        return np.clip(x, float(self.lo), upper).astype(np.int64)


@dataclass(frozen=True, slots=True, init=False)
class Empirical:
    """Resampling with replacement from observed token counts (each ``>= 1``).

    Build it from a trace with :meth:`prompts_of` / :meth:`outputs_of`.  To keep the
    correlation between a request's prompt and output lengths, use :class:`TraceLengths`.
    """

    values: tuple[int, ...] = field(repr=False)
    _array: IntArray = field(repr=False, compare=False)

    def __init__(self, values: Iterable[int]) -> None:
        vals = tuple(checks.count("value", v, 1) for v in values)
        if not vals:
            raise PolicyError("Empirical needs at least one value")
        object.__setattr__(self, "values", vals)
        object.__setattr__(self, "_array", np.asarray(vals, dtype=np.int64))

    @classmethod
    def prompts_of(cls, requests: Sequence[TraceRequest]) -> Empirical:
        """The prompt lengths of ``requests``."""
        return cls(r.prompt_tokens for r in requests)

    @classmethod
    def outputs_of(cls, requests: Sequence[TraceRequest]) -> Empirical:
        """The output lengths of ``requests`` (rows with 0 output tokens are left out)."""
        return cls(r.output_tokens for r in requests if r.output_tokens > 0)

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        idx = rng.integers(0, len(self._array), size=checks.count("n", n, 0))
        return self._array[idx]


class LengthModel(Protocol):
    """Joint prompt and output lengths for ``n`` requests."""

    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        """Draw ``n`` (prompt, output) pairs as two ``int64`` arrays of length ``n``."""
        ...


@dataclass(frozen=True, slots=True)
class IndependentLengths:
    """Prompt and output lengths drawn independently, each from its own distribution."""

    prompt: LengthDist
    output: LengthDist

    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        return self.prompt.sample(rng, n), self.output.sample(rng, n)


@dataclass(frozen=True, slots=True, init=False, eq=False)
class TraceLengths:
    """Whole (prompt, output) pairs resampled with replacement from a trace.

    Keeps the trace's joint distribution: long prompts that come with short answers (code
    completion) stay that way.
    """

    _prompts: IntArray = field(repr=False)
    _outputs: IntArray = field(repr=False)

    def __init__(self, requests: Sequence[TraceRequest]) -> None:
        if not requests:
            raise PolicyError("TraceLengths needs at least one request")
        _, p, o = _columns(requests)
        object.__setattr__(self, "_prompts", p)
        object.__setattr__(self, "_outputs", o)

    def __len__(self) -> int:
        return len(self._prompts)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        idx = rng.integers(0, len(self._prompts), size=checks.count("n", n, 0))
        return self._prompts[idx], self._outputs[idx]


# --------------------------------------------------------------------------- tenants


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


# --------------------------------------------------------------------------- synthesis


def synthesize(
    times: Sequence[float] | FloatArray,
    lengths: LengthModel,
    *,
    seed: Seed,
    mix: TenantMix | None = None,
    max_tokens: int | None = None,
) -> list[TraceRequest]:
    """A synthetic workload: one request per arrival time in ``times``.

    ``times`` must be finite, ``>= 0`` and non-decreasing (what the generators of
    :mod:`velvetrope.sim.arrivals` return).  Lengths come from ``lengths``, tenants and tiers
    from ``mix`` (``None``: every request is tenant ``"default"`` with no tier).  When
    ``max_tokens`` is given every request declares it, and true outputs longer than it are
    cut to it, as the engine would.  Lengths are drawn before tenants, from one generator.
    """
    ts = np.asarray(times, dtype=np.float64)
    if ts.ndim != 1:
        raise PolicyError("times must be a one-dimensional sequence")
    if ts.size and not (np.all(np.isfinite(ts)) and ts[0] >= 0.0 and np.all(np.diff(ts) >= 0)):
        raise PolicyError("times must be finite, >= 0 and non-decreasing")
    cap = None if max_tokens is None else checks.count("max_tokens", max_tokens, 1)
    rng = as_generator(seed)
    n = int(ts.size)
    prompts, outputs = lengths.sample(rng, n)
    if prompts.shape != (n,) or outputs.shape != (n,):
        raise PolicyError(f"length model returned arrays of the wrong shape for n={n}")
    if cap is not None:
        outputs = np.minimum(outputs, cap)
    if mix is None:
        labels: list[tuple[str, str | None]] = [("default", None)] * n
    else:
        labels = [(mix.entries[i][0], mix.entries[i][1]) for i in mix.draw(rng, n).tolist()]
    return [
        TraceRequest(t, p, o, tenant, tier, cap)
        for t, p, o, (tenant, tier) in zip(
            ts.tolist(), prompts.tolist(), outputs.tolist(), labels, strict=True
        )
    ]


# --------------------------------------------------------------------------- transforms


def rescale_time(requests: Sequence[TraceRequest], factor: float) -> list[TraceRequest]:
    """Compress (``factor > 1``) or stretch (``factor < 1``) arrivals: ``t -> t / factor``.

    ``factor`` multiplies the arrival rate: 2 doubles it.  Order, token counts and every
    other field are kept.
    """
    f = checks.number("factor", factor)
    return [replace(r, t=r.t / f) for r in requests]


def scale_to_rate(requests: Sequence[TraceRequest], target_rps: float) -> list[TraceRequest]:
    """Rescale time so that the mean arrival rate (as :func:`trace_stats` measures it) is
    ``target_rps`` requests per second."""
    target = checks.number("target_rps", target_rps)
    return rescale_time(requests, target / trace_stats(requests).mean_rps)


def head(requests: Sequence[TraceRequest], n: int) -> list[TraceRequest]:
    """The first ``n`` requests (all of them if there are fewer)."""
    return list(requests[: checks.count("n", n, 0)])


def time_window(
    requests: Sequence[TraceRequest], start: float, end: float, *, rebase: bool = True
) -> list[TraceRequest]:
    """The requests with ``start <= t < end`` of a sorted workload.

    ``0 <= start <= end``.  With ``rebase`` (the default) times are shifted by ``-start``, so
    the window starts at 0 and keeps the idle gap before its first request.
    """
    for name, v in (("start", start), ("end", end)):
        if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
            raise PolicyError(f"{name} must be a number, got {v!r}")
    if start < 0:
        raise PolicyError(f"start must be >= 0, got {start}")
    if end < start:
        raise PolicyError(f"end ({end}) must be >= start ({start})")
    times = [r.t for r in requests]
    lo = bisect_left(times, start)
    hi = bisect_left(times, end)
    window = requests[lo:hi]
    if not rebase or start == 0.0:
        return list(window)
    return [replace(r, t=max(r.t - start, 0.0)) for r in window]


def merge(*workloads: Sequence[TraceRequest]) -> list[TraceRequest]:
    """Interleave sorted workloads into one sorted workload (stable: ties keep argument
    order).  Each input must be sorted by ``t``."""
    for i, w in enumerate(workloads):
        _check_sorted(w, f"workload {i}")
    return list(heapq.merge(*workloads, key=lambda r: r.t))


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Summary of a workload.

    ``mean_rps = (count - 1) / span_s``: arrivals per second between the first and the last
    request.  Token rates are total tokens over the same span.  Percentiles interpolate
    linearly.  ``output_scv`` is C_s², the squared coefficient of variation of output lengths
    (variance / mean², population variance): 1 for exponential sizes, 0 for fixed.
    ``interarrival_cv`` is std / mean of the gaps between consecutive arrivals: 1 for Poisson.
    """

    count: int
    span_s: float
    mean_rps: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    prompt_mean: float
    prompt_p50: float
    prompt_p99: float
    output_mean: float
    output_p50: float
    output_p99: float
    output_scv: float
    interarrival_cv: float


def trace_stats(requests: Sequence[TraceRequest]) -> TraceStats:
    """Summarise a sorted workload of at least two requests spread over a positive span."""
    if len(requests) < 2:
        raise PolicyError(f"trace_stats needs at least 2 requests, got {len(requests)}")
    t, p, o = _columns(requests)
    gaps = np.diff(t)
    if np.any(gaps < 0):
        raise PolicyError("trace_stats: requests must be sorted by t")
    span = float(t[-1] - t[0])
    if span <= 0.0:
        raise PolicyError("trace_stats: all requests arrive at the same time (zero span)")
    o_mean = float(o.mean())
    gap_mean = float(gaps.mean())
    p50p, p99p = np.percentile(p, [50, 99])
    p50o, p99o = np.percentile(o, [50, 99])
    return TraceStats(
        count=len(requests),
        span_s=span,
        mean_rps=(len(requests) - 1) / span,
        prompt_tokens_per_s=float(p.sum()) / span,
        output_tokens_per_s=float(o.sum()) / span,
        prompt_mean=float(p.mean()),
        prompt_p50=float(p50p),
        prompt_p99=float(p99p),
        output_mean=o_mean,
        output_p50=float(p50o),
        output_p99=float(p99o),
        output_scv=float(o.var()) / o_mean**2 if o_mean > 0 else 0.0,
        interarrival_cv=float(gaps.std()) / gap_mean,
    )


def index_of_dispersion(requests: Sequence[TraceRequest], window_s: float) -> float:
    """Variance / mean of arrival counts in consecutive windows of ``window_s`` seconds.

    Windows tile ``[0, k * window_s)`` for the largest ``k`` that fits in the workload's span
    (a partial last window is dropped).  About 1 for Poisson arrivals, above 1 for bursty ones.
    """
    w = checks.number("window_s", window_s)
    if not requests:
        raise PolicyError("index_of_dispersion needs at least one request")
    t = np.fromiter((r.t for r in requests), dtype=np.float64, count=len(requests))
    k = int(t[-1] // w)
    if k < 2:
        raise PolicyError(f"the workload spans fewer than two windows of {w} s")
    counts = np.bincount((t[t < k * w] // w).astype(np.int64), minlength=k)
    mean = float(counts.mean())
    return float(counts.var()) / mean if mean > 0 else 0.0
