"""Length models: how many prompt and output tokens a synthetic request has.

Per dimension (:class:`LengthDist`): :class:`Fixed`, :class:`Exponential`,
:class:`LogNormal`, :class:`Empirical`; jointly (:class:`LengthModel`):
:class:`IndependentLengths` (one distribution each) or :class:`TraceLengths` (whole
prompt/output pairs of a trace).  :func:`velvetrope.sim.workload.synthesize` draws from
them.  Bad parameters raise :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from velvetrope import checks
from velvetrope.errors import PolicyError
from velvetrope.sim.trace_request import IntArray, TraceRequest, request_columns

__all__ = [
    "Empirical",
    "Exponential",
    "Fixed",
    "IndependentLengths",
    "LengthDist",
    "LengthModel",
    "LogNormal",
    "TraceLengths",
]

# Standard normal quantile at 0.99: Φ⁻¹(0.99).
_Z99 = 2.3263478740408408


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
        _, p, o = request_columns(requests)
        object.__setattr__(self, "_prompts", p)
        object.__setattr__(self, "_outputs", o)

    def __len__(self) -> int:
        return len(self._prompts)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        idx = rng.integers(0, len(self._prompts), size=checks.count("n", n, 0))
        return self._prompts[idx], self._outputs[idx]
