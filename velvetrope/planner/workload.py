"""What the planner sizes for: a workload's lengths, its design arrival rate and its tenants.

A :class:`PlanWorkload` comes from one of two places:

* **a trace** (:func:`workload_from_trace`): a built-in name (``azure_conv``, ``azure_code``)
  or a file that :func:`velvetrope.sim.load_trace` reads.  The length mix is the trace's own
  (prompt, output) pairs, the percentiles and the inter-arrival variability come from
  :func:`velvetrope.sim.trace_stats`, and the design rate is the 99th percentile of the
  one-minute arrival rate (below);
* **a YAML file** (:func:`load_workload`) that says what one usually knows about a service::

      name: chat-prod                 # optional, default: the file's stem
      prompt_tokens: {p50: 1020, p99: 4142}
      output_tokens: {p50: 129, p99: 601}
      arrival_rate_p99_1m: 8.2        # req/s: p99 of the one-minute arrival rate
      arrival_rate_mean: 5.5          # req/s, optional (reported, not used to size)
      arrival_cv: 1.1                 # optional: CV of inter-arrival gaps, default 1 (Poisson)
      tenants:                        # optional: shares of the traffic, default one tenant
        - {name: search, share: 0.7}
        - {name: batch-etl, share: 0.3}

  Lengths are then drawn from lognormals fitted to each p50/p99 pair
  (:meth:`velvetrope.sim.LogNormal.from_percentiles`), prompt and output independently,
  with a fixed seed: the same file always gives the same mix.

**The arrival pattern.**  How requests bunch up decides how long they wait, and the rate
and ``C_a²`` alone do not say it: arrival processes with the code trace's two numbers but
other gap distributions (hyperexponential, Gamma, batches) wait far less or far more than
its own arrivals do on the same fleet.  So a workload carries its arrivals, as a *pattern*
at a mean rate of one request per second (:attr:`PlanWorkload.arrival_pattern`), which the
queueing model replays at the design rate (:func:`velvetrope.planner.predict.predict`).
For a trace it is the trace's own arrivals, each whole minute stretched or squeezed to the
same rate (:func:`arrival_pattern`): the design rate already covers the changes from minute
to minute, and the pattern keeps the bursts inside each minute.  For a YAML file it is a
seeded sample of :data:`PATTERN_SIZE` arrivals: Poisson for ``arrival_cv: 1``, Gamma-renewal
gaps with that CV otherwise, evenly spaced for 0.

**The design rate is the p99 of the one-minute arrival rate, not the mean.**  Traffic that
averages 5.5 req/s spends some minutes at 8: a fleet sized on the mean runs those minutes
at ρ ≥ 1 and its queue grows for the whole minute, far beyond anything a stationary formula
predicts.  Sizing for the 99th-percentile minute means that 99 % of minutes run at or below
the planned utilisation.  For a trace the rate of each whole minute ``[60k, 60(k+1))`` is
counted (a partial last minute is dropped) and the p99 interpolates linearly between them
(:func:`one_minute_rates`).  ``--peak-rps`` replaces it (:meth:`PlanWorkload.with_design_rate`).

Units: rates in requests per second, lengths in tokens.  A YAML file that cannot be used
raises :class:`~velvetrope.errors.ConfigError` whose message starts with the file name and
names the field; a trace that cannot be read raises
:class:`~velvetrope.errors.TraceError`; bad values passed in code raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import numpy as np
from numpy.typing import NDArray
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    model_validator,
)

from velvetrope.errors import PolicyError
from velvetrope.sim import (
    BUILTIN_TRACES,
    Deterministic,
    GammaRenewal,
    LogNormal,
    Poisson,
    TraceRequest,
    load_trace,
    trace_stats,
)
from velvetrope.yaml_config import load_model, read_text, reject_bool

__all__ = [
    "MINUTE_S",
    "PATTERN_SIZE",
    "YAML_SAMPLE_SIZE",
    "PlanWorkload",
    "Tenant",
    "arrival_pattern",
    "gap_scv",
    "load_workload",
    "one_minute_rates",
    "parse_workload",
    "workload_from_trace",
]

MINUTE_S = 60.0
"""Width of the windows whose arrival rates give the design rate (seconds)."""

YAML_SAMPLE_SIZE = 8192
"""Length pairs drawn from a YAML workload's lognormals (seeded; see :func:`parse_workload`)."""

PATTERN_SIZE = 20_000
"""Arrivals in the seeded pattern of a YAML workload (see :func:`parse_workload`)."""

_YAML_SEED = 20231116

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant and its share of the traffic (``0 < share <= 1``; shares sum to 1)."""

    name: str
    share: float


@dataclass(frozen=True, eq=False)
class PlanWorkload:
    """A workload as the planner sees it; see the module docstring.

    Attributes:
        name: a label for reports.
        source: where it came from (``"trace azure_conv"``, ``"file w.yaml"``).
        design_rps: the arrival rate to size for (req/s), the p99 one-minute rate unless
            replaced by :meth:`with_design_rate`.
        design_rate_origin: one line saying where ``design_rps`` came from.
        mean_rps: the long-run mean rate (req/s), when known.
        arrival_scv: ``C_a²``, the squared coefficient of variation of the gaps of
            ``arrival_pattern`` (1 for Poisson): for a trace, the gaps inside each minute at
            a common rate; reported, and used by the Allen–Cunneen wait when there is no
            pattern.
        prompt: prompt lengths of the length mix (tokens, each >= 1, read-only).
        output: output lengths of the length mix (tokens, each >= 0, read-only; aligned with
            ``prompt``).
        prompt_p50, prompt_p99, output_p50, output_p99: percentiles of the source (for a
            YAML file, the values it states; for a trace, measured).
        tenants: the tenants and their shares, largest share first.
        arrival_pattern: sorted arrival times (s) at a mean rate of 1 req/s, starting at 0,
            read-only (see the module docstring), or ``None``: Poisson arrivals, modelled
            in closed form.
        whole_trace_scv: for a trace, ``C_a²`` of all its gaps, minute-to-minute rate changes
            included (reported next to ``arrival_scv``); ``None`` otherwise.
    """

    name: str
    source: str
    design_rps: float
    design_rate_origin: str
    mean_rps: float | None
    arrival_scv: float
    prompt: IntArray
    output: IntArray
    prompt_p50: float
    prompt_p99: float
    output_p50: float
    output_p99: float
    tenants: tuple[Tenant, ...]
    arrival_pattern: FloatArray | None = None
    whole_trace_scv: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.design_rps) and self.design_rps > 0):
            raise PolicyError(f"design_rps must be finite and > 0 (got {self.design_rps!r})")
        if not (math.isfinite(self.arrival_scv) and self.arrival_scv >= 0):
            raise PolicyError(f"arrival_scv must be finite and >= 0 (got {self.arrival_scv!r})")
        if self.prompt.shape != self.output.shape or self.prompt.ndim != 1 or not len(self.prompt):
            raise PolicyError("prompt and output must be aligned, non-empty 1-D arrays")
        if int(self.prompt.min()) < 1 or int(self.output.min()) < 0:
            raise PolicyError("prompt lengths must be >= 1 and output lengths >= 0")
        if not self.tenants or abs(sum(t.share for t in self.tenants) - 1.0) > 1e-9:
            raise PolicyError("tenants must be non-empty with shares summing to 1")
        for a in (self.prompt, self.output):
            a.setflags(write=False)
        pat = self.arrival_pattern
        if pat is not None:
            if pat.ndim != 1 or pat.size < 2 or not bool(np.all(np.isfinite(pat))):
                raise PolicyError("arrival_pattern must be a 1-D array of >= 2 finite times")
            if bool(np.any(np.diff(pat) < 0)):
                raise PolicyError("arrival_pattern must be sorted")
            pat.setflags(write=False)

    @property
    def mean_prompt(self) -> float:
        """Mean prompt length of the mix (tokens)."""
        return float(self.prompt.mean())

    @property
    def mean_output(self) -> float:
        """Mean output length of the mix (tokens)."""
        return float(self.output.mean())

    @property
    def mean_tokens(self) -> float:
        """Mean prompt + output tokens per request: what an edge bucket charges."""
        return self.mean_prompt + self.mean_output

    def with_design_rate(self, rps: float, origin: str) -> PlanWorkload:
        """A copy sized for ``rps`` req/s (e.g. ``--peak-rps``); ``origin`` says why."""
        v = float(rps)
        if not (math.isfinite(v) and v > 0):
            raise PolicyError(f"the design rate must be finite and > 0 req/s (got {rps!r})")
        return replace(self, design_rps=v, design_rate_origin=origin)


# --------------------------------------------------------------------------- traces


def one_minute_rates(times: Sequence[float] | NDArray[np.float64]) -> NDArray[np.float64]:
    """Arrival rates (req/s) of each whole minute ``[60k, 60(k+1))`` of sorted ``times``.

    Times are seconds from the start of the workload (a trace loaded by
    :func:`velvetrope.sim.load_trace` starts at 0); a partial last minute is dropped.
    Raises :class:`~velvetrope.errors.PolicyError` when fewer than two whole minutes are
    covered: one window is not a distribution.
    """
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 1 or t.size == 0:
        raise PolicyError("one_minute_rates needs a non-empty 1-D array of arrival times")
    k = int((t[-1] - t[0]) // MINUTE_S)
    if k < 2:
        raise PolicyError(
            f"the workload spans {float(t[-1] - t[0]):.1f} s, fewer than two whole minutes: "
            "too short to measure the p99 of the one-minute rate (give the design rate instead)"
        )
    rel = t - t[0]
    counts = np.bincount((rel[rel < k * MINUTE_S] // MINUTE_S).astype(np.int64), minlength=k)
    return counts.astype(np.float64) / MINUTE_S


def arrival_pattern(times: Sequence[float] | FloatArray) -> FloatArray:
    """Sorted arrival ``times`` (s) as a pattern at a mean rate of 1 req/s, starting at 0.

    Each whole minute ``[60k, 60(k+1))`` holding ``m >= 1`` arrivals becomes a stretch of
    ``m`` seconds in which they keep their relative positions (empty minutes and a partial
    last minute drop out), so every minute runs at the same rate and the bursts inside it
    keep their shape.  Times spanning fewer than two whole minutes are scaled as a whole
    (``n − 1`` gaps over ``n − 1`` seconds).  Needs at least two arrivals over a positive span.
    """
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 1 or t.size < 2 or not float(t[-1] - t[0]) > 0:
        raise PolicyError("an arrival pattern needs >= 2 sorted arrival times over a positive span")
    rel = t - t[0]
    k = int(rel[-1] // MINUTE_S)
    if k < 2:
        return np.asarray(rel * ((t.size - 1) / float(rel[-1])), dtype=np.float64)
    rel = rel[rel < k * MINUTE_S]
    minute = (rel // MINUTE_S).astype(np.int64)
    counts = np.bincount(minute, minlength=k).astype(np.float64)
    offset = np.concatenate(([0.0], np.cumsum(counts)[:-1]))
    out = offset[minute] + (rel - minute * MINUTE_S) * (counts[minute] / MINUTE_S)
    return np.asarray(out - out[0], dtype=np.float64)


def gap_scv(times: FloatArray) -> float:
    """``C_a²`` of the gaps between sorted ``times`` (variance / mean²)."""
    gaps = np.diff(times)
    m = float(gaps.mean())
    return float(gaps.var()) / (m * m)


def _tenants_of(requests: Sequence[TraceRequest]) -> tuple[Tenant, ...]:
    """Tenant shares by the prompt + output tokens each sent (what buckets charge)."""
    tokens: Counter[str] = Counter()
    for r in requests:
        tokens[r.tenant] += r.prompt_tokens + r.output_tokens
    total = sum(tokens.values())
    return tuple(Tenant(name, n / total) for name, n in sorted(tokens.items(), key=_by_share))


def _by_share(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


def workload_from_trace(
    source: str | Path,
    *,
    requests: Sequence[TraceRequest] | None = None,
    design_rps: float | None = None,
) -> PlanWorkload:
    """A workload from a trace: ``source`` is a built-in name or a file path.

    ``requests`` (already loaded) skips reading ``source``, which is then only a label.
    The design rate is the p99 one-minute rate (:func:`one_minute_rates`) unless
    ``design_rps`` is given (a trace shorter than two minutes needs it).  ``C_a²`` is that
    ``C_a²`` of the gaps of the arrival pattern (:func:`arrival_pattern`), the whole
    trace's in ``whole_trace_scv``; tenant shares are by tokens sent.  Needs at least two
    requests over a positive span.
    """
    reqs = list(requests) if requests is not None else load_trace(source)
    stats = trace_stats(reqs)  # raises PolicyError for < 2 requests or a zero span
    label = str(source)
    if design_rps is None:
        rates = one_minute_rates([r.t for r in reqs])
        rps = float(np.percentile(rates, 99))
        origin = (
            f"p99 of the one-minute arrival rate of trace {label} ({len(rates)} minutes; "
            f"mean {stats.mean_rps:.3g} req/s, busiest minute {float(rates.max()):.3g} req/s)"
        )
    else:
        rps = float(design_rps)
        origin = f"given (trace {label}: mean {stats.mean_rps:.3g} req/s"
        if stats.span_s >= 2 * MINUTE_S:
            p99 = float(np.percentile(one_minute_rates([r.t for r in reqs]), 99))
            origin += f", p99 one-minute rate {p99:.3g} req/s"
        origin += ")"
    prompt = np.fromiter((r.prompt_tokens for r in reqs), dtype=np.int64, count=len(reqs))
    output = np.fromiter((r.output_tokens for r in reqs), dtype=np.int64, count=len(reqs))
    pattern = arrival_pattern(np.fromiter((r.t for r in reqs), dtype=np.float64, count=len(reqs)))
    return PlanWorkload(
        name=label if label in BUILTIN_TRACES else Path(label).stem,
        source=f"trace {label}",
        design_rps=rps,
        design_rate_origin=origin,
        mean_rps=stats.mean_rps,
        arrival_scv=gap_scv(pattern),
        prompt=prompt,
        output=output,
        prompt_p50=stats.prompt_p50,
        prompt_p99=stats.prompt_p99,
        output_p50=stats.output_p50,
        output_p99=stats.output_p99,
        tenants=_tenants_of(reqs),
        arrival_pattern=pattern,
        whole_trace_scv=stats.interarrival_cv**2,
    )


# --------------------------------------------------------------------------- YAML


_Positive = Annotated[float, BeforeValidator(reject_bool), Field(gt=0.0, allow_inf_nan=False)]
_NonNeg = Annotated[float, BeforeValidator(reject_bool), Field(ge=0.0, allow_inf_nan=False)]


class _Percentiles(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    p50: _Positive = Field(description="Median, in tokens.")
    p99: _Positive = Field(description="99th percentile, in tokens (>= p50).")

    @model_validator(mode="after")
    def _ordered(self) -> _Percentiles:
        if self.p99 < self.p50:
            raise ValueError(f"p99 ({self.p99:g}) must be >= p50 ({self.p50:g})")
        return self


class _TenantModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[StrictStr, Field(min_length=1)]
    share: _Positive = Field(description="Relative share of the traffic (normalised).")


class _WorkloadModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[StrictStr, Field(min_length=1)] | None = None
    prompt_tokens: _Percentiles
    output_tokens: _Percentiles
    arrival_rate_p99_1m: _Positive = Field(description="p99 one-minute arrival rate, req/s.")
    arrival_rate_mean: _Positive | None = None
    arrival_cv: _NonNeg = 1.0
    tenants: tuple[_TenantModel, ...] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> _WorkloadModel:
        if self.arrival_rate_mean is not None and self.arrival_rate_mean > self.arrival_rate_p99_1m:
            raise ValueError(
                f"arrival_rate_mean ({self.arrival_rate_mean:g}) exceeds "
                f"arrival_rate_p99_1m ({self.arrival_rate_p99_1m:g}): the p99 minute cannot be "
                "below the mean"
            )
        if self.tenants is not None:
            names = [t.name for t in self.tenants]
            if not names:
                raise ValueError("tenants: list at least one tenant, or leave the key out")
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"tenants: name(s) listed twice: {', '.join(dup)}")
        return self


def parse_workload(text: str, source: str = "<workload>") -> PlanWorkload:
    """Build a workload from YAML ``text``; errors are ConfigErrors starting with ``source``.

    The length mix is :data:`YAML_SAMPLE_SIZE` pairs drawn with a fixed seed from
    lognormals fitted to the stated p50/p99 (prompt and output independent, each >= 1).
    ``arrival_cv`` (default 1) gives ``C_a² = arrival_cv²`` and the arrival pattern:
    :data:`PATTERN_SIZE` seeded arrivals at 1 req/s, Poisson for a CV of 1, Gamma-renewal
    for another positive CV, evenly spaced for 0.
    """
    m = load_model(_WorkloadModel, text, source, "workload")
    rng = np.random.default_rng(_YAML_SEED)
    prompt = LogNormal.from_percentiles(m.prompt_tokens.p50, m.prompt_tokens.p99).sample(
        rng, YAML_SAMPLE_SIZE
    )
    output = LogNormal.from_percentiles(m.output_tokens.p50, m.output_tokens.p99).sample(
        rng, YAML_SAMPLE_SIZE
    )
    if m.tenants is None:
        tenants: tuple[Tenant, ...] = (Tenant("default", 1.0),)
    else:
        total = sum(t.share for t in m.tenants)
        tenants = tuple(
            Tenant(t.name, t.share / total)
            for t in sorted(m.tenants, key=lambda t: (-t.share, t.name))
        )
    name = m.name if m.name is not None else Path(source).stem
    cv = m.arrival_cv
    process = Deterministic(1.0) if cv == 0 else Poisson(1.0) if cv == 1 else GammaRenewal(1.0, cv)
    pattern = process.times(_YAML_SEED, count=PATTERN_SIZE)
    return PlanWorkload(
        name=name,
        source=f"file {source}",
        design_rps=m.arrival_rate_p99_1m,
        design_rate_origin=f"arrival_rate_p99_1m in {source}",
        mean_rps=m.arrival_rate_mean,
        arrival_scv=m.arrival_cv**2,
        prompt=prompt,
        output=output,
        prompt_p50=m.prompt_tokens.p50,
        prompt_p99=m.prompt_tokens.p99,
        output_p50=m.output_tokens.p50,
        output_p99=m.output_tokens.p99,
        tenants=tenants,
        arrival_pattern=pattern - pattern[0],
    )


def load_workload(path: str | Path) -> PlanWorkload:
    """Read a workload YAML file (format in the module docstring).

    Raises :class:`~velvetrope.errors.ConfigError` naming the file (and the field) when the
    file is missing, unreadable, not YAML or invalid.
    """
    p = Path(path)
    return parse_workload(read_text(p, "workload"), str(p))
