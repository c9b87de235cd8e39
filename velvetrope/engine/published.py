"""Published benchmark results as data: the table, its rows, and the workloads they describe.

The table (``velvetrope/engine/data/published_vllm.csv``, described in the ``README.md``
next to it) holds one row per published number: which engine profile it speaks for, the
workload that produced it, the engine configuration the source ran, the metric and its
value.  :func:`load_table` reads and validates it; :func:`scenarios` groups the rows that
one benchmark run produced (the same workload, arrivals and configuration), so that
:mod:`velvetrope.engine.replay` simulates each run once.

Columns (every row; empty means "not stated"):

``id``, ``source``, ``profile`` (a built-in profile name), ``hardware``, ``tp``, ``model``,
``engine``, ``frontend`` (``offline`` or ``http``), ``workload`` (``fixed`` lengths or
``sharegpt``), ``prompt_tokens`` / ``output_tokens`` (the lengths for ``fixed``; the stated
*mean* lengths, or empty, for ``sharegpt``), ``num_prompts``, ``arrival`` (``burst``: all
at once, a rate of "inf" or an offline batch; ``poisson``: at ``rate_rps``),
``max_num_seqs`` (empty: not published; the fit finds it), ``max_num_batched_tokens``,
``scheduler_steps`` (vLLM's multi-step
scheduling, 1 = off), ``scheduler`` (the engine's scheduler, one of
:data:`~velvetrope.engine.profile.SCHEDULERS`: ``vllm-v0`` is vLLM V0 without chunked
prefill, prompts run in steps of their own; ``vllm-v1`` mixes prompt chunks with decodes;
it must be the scheduler of the row's profile), ``metric`` (``throughput``,
``ttft``, ``tpot`` or ``e2e``: a request's latency from send to last token), ``stat``
(``mean``, ``median``, ``max``; ``total`` for throughput), ``value``, ``unit`` (``ms``
for latencies; ``req_s``, ``out_tok_s`` or ``total_tok_s`` for throughput), ``approx`` (1
when read from a plot or otherwise inferred) and ``note`` (where exactly the number comes from).

ShareGPT workloads draw ``(prompt, output)`` pairs from ``sharegpt_lengths.csv``: the
per-request token counts of a published 320-request ShareGPT run (LambdaLabsML
vllm-benchmark, Llama-3 tokenizer, vLLM's sampler with seed 0; requests that returned no
token are left out), rescaled to the row's stated means when it states them.  A bad table
raises :class:`~velvetrope.errors.ConfigError` naming the file, the row and the column.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Literal, cast

import numpy as np
from numpy.typing import NDArray

from velvetrope.engine.profile import SCHEDULERS, Scheduler
from velvetrope.errors import ConfigError

__all__ = [
    "DEFAULT_TABLE",
    "Metric",
    "PublishedPoint",
    "Scenario",
    "load_table",
    "read_default_table",
    "scenarios",
    "sharegpt_sample",
]

Metric = Literal["throughput", "ttft", "tpot", "e2e"]
IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

DEFAULT_TABLE = "published_vllm.csv"
"""The table shipped in ``velvetrope/engine/data``."""

_SHAREGPT = "sharegpt_lengths.csv"
_METRIC_UNITS = {
    "throughput": ("req_s", "out_tok_s", "total_tok_s"),
    "ttft": ("ms",),
    "tpot": ("ms",),
    "e2e": ("ms",),
}
_STATS = {
    "throughput": ("total",),
    "ttft": ("mean", "median", "max"),
    "tpot": ("mean", "median"),
    "e2e": ("mean", "median"),
}


@dataclass(frozen=True, slots=True)
class PublishedPoint:
    """One published number and everything needed to reproduce it; see the module docstring."""

    id: str
    source: str
    profile: str
    hardware: str
    tp: int
    model: str
    engine: str
    frontend: Literal["offline", "http"]
    workload: Literal["fixed", "sharegpt"]
    prompt_tokens: int | None
    output_tokens: int | None
    num_prompts: int
    arrival: Literal["burst", "poisson"]
    rate_rps: float | None
    max_num_seqs: int | None
    max_num_batched_tokens: int
    scheduler_steps: int
    scheduler: Scheduler
    metric: Metric
    stat: str
    value: float
    unit: str
    approx: bool
    note: str

    def scenario_key(self) -> tuple[object, ...]:
        """Rows with equal keys come from one benchmark run (one simulation)."""
        return (
            self.source,
            self.profile,
            self.workload,
            self.prompt_tokens,
            self.output_tokens,
            self.num_prompts,
            self.arrival,
            self.rate_rps,
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.scheduler_steps,
            self.scheduler,
        )


_COLUMNS = tuple(f.name for f in fields(PublishedPoint))


def _int(text: str, col: str, lo: int, optional: bool = False) -> int | None:
    if text == "" and optional:
        return None
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"column {col!r}: expected an integer, got {text!r}") from None
    if v < lo:
        raise ValueError(f"column {col!r}: must be >= {lo}, got {v}")
    return v


def _choice(text: str, col: str, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if text not in allowed:
        raise ValueError(f"column {col!r}: expected one of {', '.join(allowed)}, got {text!r}")
    return text


def _parse_row(row: dict[str, str]) -> PublishedPoint:
    metric = cast(Metric, _choice(row["metric"], "metric", _METRIC_UNITS))
    try:
        value = float(row["value"])
    except ValueError:
        raise ValueError(f"column 'value': expected a number, got {row['value']!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"column 'value': must be a finite number > 0, got {value!r}")
    arrival = _choice(row["arrival"], "arrival", ("burst", "poisson"))
    rate: float | None = None
    if arrival == "poisson":
        try:
            rate = float(row["rate_rps"])
        except ValueError:
            raise ValueError("column 'rate_rps': a poisson arrival needs a rate > 0") from None
        if not rate > 0:
            raise ValueError(f"column 'rate_rps': must be > 0, got {rate!r}")
    workload = _choice(row["workload"], "workload", ("fixed", "sharegpt"))
    prompt = _int(row["prompt_tokens"], "prompt_tokens", 1, optional=workload == "sharegpt")
    output = _int(row["output_tokens"], "output_tokens", 1, optional=workload == "sharegpt")
    seqs = _int(row["max_num_seqs"], "max_num_seqs", 1, optional=True)
    budget = _int(row["max_num_batched_tokens"], "max_num_batched_tokens", 1)
    assert budget is not None
    if seqs is not None and budget < seqs:
        raise ValueError("column 'max_num_batched_tokens': must be >= max_num_seqs")
    return PublishedPoint(
        id=row["id"] or _fail("id", "must not be empty"),
        source=row["source"] or _fail("source", "must not be empty"),
        profile=row["profile"] or _fail("profile", "must not be empty"),
        hardware=row["hardware"],
        tp=cast(int, _int(row["tp"], "tp", 1)),
        model=row["model"],
        engine=row["engine"],
        frontend=cast(
            Literal["offline", "http"], _choice(row["frontend"], "frontend", ("offline", "http"))
        ),
        scheduler=cast(Scheduler, _choice(row["scheduler"], "scheduler", SCHEDULERS)),
        workload=cast(Literal["fixed", "sharegpt"], workload),
        prompt_tokens=prompt,
        output_tokens=output,
        num_prompts=cast(int, _int(row["num_prompts"], "num_prompts", 1)),
        arrival=cast(Literal["burst", "poisson"], arrival),
        rate_rps=rate,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        scheduler_steps=cast(int, _int(row["scheduler_steps"], "scheduler_steps", 1)),
        metric=metric,
        stat=_choice(row["stat"], "stat", _STATS[metric]),
        value=value,
        unit=_choice(row["unit"], "unit", _METRIC_UNITS[metric]),
        approx=_choice(row["approx"], "approx", ("0", "1")) == "1",
        note=row["note"],
    )


def _fail(col: str, msg: str) -> str:
    raise ValueError(f"column {col!r}: {msg}")


def _parse(lines: Iterable[str], source: str) -> list[PublishedPoint]:
    reader = csv.DictReader(lines)
    missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ConfigError(f"{source}: missing column(s) {', '.join(missing)}")
    points: list[PublishedPoint] = []
    seen: set[str] = set()
    for n, row in enumerate(reader, start=2):
        try:
            p = _parse_row({k: (v or "").strip() for k, v in row.items() if k is not None})
        except ValueError as exc:
            raise ConfigError(f"{source}: row {n}: {exc}") from None
        if p.id in seen:
            raise ConfigError(f"{source}: row {n}: duplicate id {p.id!r}")
        seen.add(p.id)
        points.append(p)
    if not points:
        raise ConfigError(f"{source}: the table has no rows")
    return points


def load_table(path: str | Path) -> list[PublishedPoint]:
    """Read and validate a published-results table (CSV with the columns above)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the table: {exc}") from None
    return _parse(text.splitlines(), str(path))


def _data(name: str) -> str:
    return resources.files("velvetrope.engine").joinpath("data", name).read_text(encoding="utf-8")


def read_default_table() -> list[PublishedPoint]:
    """The table shipped with velvetrope (:data:`DEFAULT_TABLE`)."""
    return _parse(_data(DEFAULT_TABLE).splitlines(), f"built-in {DEFAULT_TABLE}")


_SAMPLE: tuple[IntArray, IntArray] | None = None


def sharegpt_sample() -> tuple[IntArray, IntArray]:
    """The ShareGPT ``(prompt, output)`` token counts (requests with an output only)."""
    global _SAMPLE
    if _SAMPLE is None:
        rows = list(csv.DictReader(_data(_SHAREGPT).splitlines()))
        pairs = [(int(r["prompt_tokens"]), int(r["output_tokens"])) for r in rows]
        pairs = [(p, o) for p, o in pairs if p >= 1 and o >= 1]
        _SAMPLE = (
            np.array([p for p, _ in pairs], dtype=np.int64),
            np.array([o for _, o in pairs], dtype=np.int64),
        )
    return _SAMPLE


@dataclass(frozen=True)
class Scenario:
    """One benchmark run to simulate: its requests, arrivals and engine configuration.

    ``prompts``/``outputs`` are the per-request token counts and ``arrivals`` their
    send times (seconds, sorted, the first at 0); ``points`` the rows it reproduces.
    """

    key: tuple[object, ...]
    points: tuple[PublishedPoint, ...]
    prompts: IntArray
    outputs: IntArray
    arrivals: FloatArray

    @property
    def first(self) -> PublishedPoint:
        """A representative row (every row of a scenario shares its configuration)."""
        return self.points[0]


def _rescale(values: IntArray, mean: int | None) -> IntArray:
    if mean is None:
        return values
    scaled = np.rint(values * (mean / float(values.mean())))
    out: IntArray = np.maximum(scaled, 1).astype(np.int64)
    return out


def _workload(p: PublishedPoint, seed: int) -> tuple[IntArray, IntArray, FloatArray]:
    rng = np.random.default_rng(seed)
    n = p.num_prompts
    if p.workload == "fixed":
        assert p.prompt_tokens is not None and p.output_tokens is not None
        prompts = np.full(n, p.prompt_tokens, dtype=np.int64)
        outputs = np.full(n, p.output_tokens, dtype=np.int64)
    else:
        sp, so = sharegpt_sample()
        idx = rng.integers(0, len(sp), size=n)
        prompts = _rescale(sp[idx], p.prompt_tokens)
        outputs = _rescale(so[idx], p.output_tokens)
    if p.arrival == "burst":
        arrivals = np.zeros(n)
    else:
        assert p.rate_rps is not None
        gaps = rng.exponential(1.0 / p.rate_rps, size=n)
        gaps[0] = 0.0
        arrivals = np.cumsum(gaps)
    return prompts, outputs, arrivals


def scenarios(points: Sequence[PublishedPoint], seed: int = 0) -> list[Scenario]:
    """Group ``points`` by :meth:`PublishedPoint.scenario_key`, in first-seen order.

    Workloads are drawn with ``numpy.random.default_rng(seed + i)`` for the ``i``-th
    scenario, so the same table and seed always give the same requests.
    """
    groups: dict[tuple[object, ...], list[PublishedPoint]] = {}
    for p in points:
        groups.setdefault(p.scenario_key(), []).append(p)
    out: list[Scenario] = []
    for i, (key, pts) in enumerate(groups.items()):
        prompts, outputs, arrivals = _workload(pts[0], seed + i)
        out.append(Scenario(key, tuple(pts), prompts, outputs, arrivals))
    return out
