"""Output-length policy of the simulated engine: how many tokens a request generates.

A real model stops at EOS; the simulated one decides up front.  By default the length is a
**deterministic draw seeded by the prompt**: the same prompt (and policy seed) always gets
the same length, on every run and every engine, so experiments are reproducible and a
replayed request behaves like the original.  The draw comes from a configurable
distribution (:func:`parse_lengths`), by default a lognormal close to the Azure LLM
conversation trace (2023): median 129 tokens, p99 about 600 (the trace has 129 / 601).

The drawn length is capped by the request's ``max_tokens``; with ``ignore_eos`` it is
exactly ``max_tokens`` (vLLM's extension, used by benchmark clients that replay a trace's
output lengths).  ``finish_reason`` follows OpenAI: ``"length"`` when the cap cut the
answer (or ``ignore_eos`` ran to it), ``"stop"`` when the draw ended first.

Distribution specs (:func:`parse_lengths`)::

    lognormal                       median 129, p99 600 (the default)
    lognormal:median=200,p99=1500   any of median=, p99=, min=, max=
    fixed:128                       always 128
    uniform:16:512                  uniform integer in [16, 512]

Mechanism: ``blake2b(seed, key)`` gives 64 bits, turned into ``u`` in (0, 1) and mapped
through the distribution's inverse CDF; no random-number generator state is shared, so the
policy is safe to call from anywhere and costs a few microseconds.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, Protocol

from velvetrope.errors import ConfigError

__all__ = [
    "DEFAULT_LENGTHS",
    "FixedLengths",
    "LengthDistribution",
    "LogNormalLengths",
    "OutputDecision",
    "OutputPolicy",
    "UniformLengths",
    "parse_lengths",
    "unit_from_key",
]

_Z99 = NormalDist().inv_cdf(0.99)  # 2.326...
_STD_NORMAL = NormalDist()


class LengthDistribution(Protocol):
    """A distribution of output lengths, sampled by inverse CDF."""

    @property
    def spec(self) -> str:
        """The spec string that :func:`parse_lengths` turns back into this distribution."""
        ...

    def quantile(self, u: float) -> int:
        """The length at quantile ``u`` in (0, 1); at least 1."""
        ...


@dataclass(frozen=True, slots=True)
class LogNormalLengths:
    """Lognormal lengths with the given ``median`` and 99th percentile, clamped to
    ``[minimum, maximum]`` (``maximum=None``: no upper clamp besides ``max_tokens``).

    Requires ``1 <= median < p99`` and ``1 <= minimum``; ``maximum >= minimum`` if set.
    """

    median: float = 129.0
    p99: float = 600.0
    minimum: int = 1
    maximum: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and math.isfinite(self.p99)):
            raise ConfigError(f"output lengths {self.spec!r}: median and p99 must be finite")
        if not 1 <= self.median < self.p99:
            raise ConfigError(f"output lengths {self.spec!r}: need 1 <= median < p99")
        if self.minimum < 1 or (self.maximum is not None and self.maximum < self.minimum):
            raise ConfigError(f"output lengths {self.spec!r}: need 1 <= min <= max")

    @property
    def sigma(self) -> float:
        """Standard deviation of ``log(length)``: ``ln(p99 / median) / z_0.99``."""
        return math.log(self.p99 / self.median) / _Z99

    @property
    def spec(self) -> str:
        s = f"lognormal:median={self.median:g},p99={self.p99:g}"
        if self.minimum != 1:
            s += f",min={self.minimum}"
        if self.maximum is not None:
            s += f",max={self.maximum}"
        return s

    def quantile(self, u: float) -> int:
        n = round(self.median * math.exp(self.sigma * _STD_NORMAL.inv_cdf(u)))
        if self.maximum is not None and n > self.maximum:
            n = self.maximum
        return max(self.minimum, n)


@dataclass(frozen=True, slots=True)
class FixedLengths:
    """Always ``n`` tokens (``n >= 1``)."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"output lengths 'fixed:{self.n}': need n >= 1")

    @property
    def spec(self) -> str:
        return f"fixed:{self.n}"

    def quantile(self, u: float) -> int:
        return self.n


@dataclass(frozen=True, slots=True)
class UniformLengths:
    """A uniform integer in ``[low, high]`` (``1 <= low <= high``)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ConfigError(f"output lengths {self.spec!r}: need 1 <= low <= high")

    @property
    def spec(self) -> str:
        return f"uniform:{self.low}:{self.high}"

    def quantile(self, u: float) -> int:
        return min(self.high, self.low + int(u * (self.high - self.low + 1)))


DEFAULT_LENGTHS = LogNormalLengths()
"""Median 129, p99 600: close to the Azure LLM conversation trace (129 / 601)."""


def _int(spec: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"output lengths {spec!r}: {text!r} is not an integer") from None


def _float(spec: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"output lengths {spec!r}: {text!r} is not a number") from None


def parse_lengths(spec: str) -> LengthDistribution:
    """Parse a distribution spec (module docstring); :class:`ConfigError` if malformed."""
    kind, _, rest = spec.partition(":")
    if kind == "lognormal":
        kw: dict[str, float] = {}
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            if not eq or key not in ("median", "p99", "min", "max"):
                raise ConfigError(
                    f"output lengths {spec!r}: expected median=, p99=, min= or max=, got {item!r}"
                )
            kw[key] = _float(spec, value)
        maximum = kw.get("max")
        return LogNormalLengths(
            median=kw.get("median", DEFAULT_LENGTHS.median),
            p99=kw.get("p99", DEFAULT_LENGTHS.p99),
            minimum=int(kw.get("min", 1)),
            maximum=None if maximum is None else int(maximum),
        )
    if kind == "fixed":
        return FixedLengths(_int(spec, rest))
    if kind == "uniform":
        low, sep, high = rest.partition(":")
        if not sep:
            raise ConfigError(f"output lengths {spec!r}: expected uniform:LOW:HIGH")
        return UniformLengths(_int(spec, low), _int(spec, high))
    raise ConfigError(
        f"unknown output lengths {spec!r}: expected lognormal[:median=M,p99=P], "
        f"fixed:N or uniform:LOW:HIGH"
    )


def unit_from_key(key: str | bytes, seed: int = 0) -> float:
    """A deterministic number in (0, 1) from ``key`` and ``seed`` (64-bit blake2b)."""
    data = key.encode("utf-8", "surrogatepass") if isinstance(key, str) else key
    h = hashlib.blake2b(data, digest_size=8, key=seed.to_bytes(8, "little", signed=True))
    return ((int.from_bytes(h.digest(), "little") >> 11) + 0.5) / 9007199254740992.0


@dataclass(frozen=True, slots=True)
class OutputDecision:
    """How many tokens to generate and why the generation ends."""

    tokens: int
    finish_reason: Literal["stop", "length"]
    key_hash: float
    """The ``u`` in (0, 1) the draw used; also seeds the filler text."""


@dataclass(frozen=True, slots=True)
class OutputPolicy:
    """Decides a request's output length; see the module docstring.

    ``lengths`` is the distribution, ``seed`` changes every draw at once (a different but
    equally reproducible run).
    """

    lengths: LengthDistribution = DEFAULT_LENGTHS
    seed: int = 0

    def decide(
        self, key: str | bytes, max_tokens: int, *, ignore_eos: bool = False
    ) -> OutputDecision:
        """The output of a request whose prompt is ``key`` and whose cap is ``max_tokens``.

        ``max_tokens >= 1`` (the caller resolved a missing one to the room left in the
        context).  Returns ``max_tokens`` tokens with ``"length"`` if ``ignore_eos`` or if
        the draw reaches the cap, else the draw with ``"stop"``.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        u = unit_from_key(key, self.seed)
        if ignore_eos:
            return OutputDecision(max_tokens, "length", u)
        n = self.lengths.quantile(u)
        if n >= max_tokens:
            return OutputDecision(max_tokens, "length", u)
        return OutputDecision(n, "stop", u)
