"""Helpers shared by the studies: the fleet, policies, load scaling, statistics and reports.

Everything here is deterministic: no wall-clock time reaches a report (run times are printed
to stdout only), numbers are formatted with fixed precision and plots are saved without a
software stamp, so a study run twice writes the same bytes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from velvetrope.core import PolicyConfig
from velvetrope.engine import EngineProfile, load_profile
from velvetrope.sim.arrivals import Poisson
from velvetrope.sim.capacity import Capacity, replica_capacity
from velvetrope.sim.loop import scale_to_load
from velvetrope.sim.report import markdown_table, save_figure
from velvetrope.sim.workload import TraceLengths, TraceRequest, synthesize

__all__ = [
    "PROFILE_NAME",
    "UNBOUNDED",
    "Progress",
    "Report",
    "at_load",
    "capacity_at",
    "engine_profile",
    "f1",
    "f2",
    "f3",
    "make_policy",
    "mean_of",
    "pct",
    "pctl",
    "poisson_workload",
    "save_plot",
]

PROFILE_NAME = "llama3-8b-h100"
"""The engine model every study runs: Llama-3-8B on one H100 (vLLM v1 defaults)."""

UNBOUNDED = 1 << 40
"""A ``queue.max_queued`` that never binds."""

FloatArray = NDArray[np.float64]


def engine_profile() -> EngineProfile:
    return load_profile(PROFILE_NAME)


def make_policy(
    preset: str,
    *,
    max_in_flight: int,
    max_queued: int = UNBOUNDED,
    queue: Mapping[str, Any] | None = None,
    tiers: Sequence[Mapping[str, Any]] | None = None,
    tenants: Sequence[Mapping[str, Any]] | None = None,
    pools: Sequence[Mapping[str, Any]] | None = None,
    routes: Sequence[Mapping[str, Any]] | None = None,
    saturation: Mapping[str, Any] | None = None,
) -> PolicyConfig:
    """A policy: ``preset`` with one pool of ``max_in_flight`` slots (or ``pools``).

    The engine-saturation rule is off unless ``saturation`` is given: studies (a) to (f)
    predate it and their reports were measured without it (the engines there rarely queue:
    64 slots per replica against an engine that runs 1,024).
    """
    doc: dict[str, Any] = {
        "preset": preset,
        "queue": {"max_queued": max_queued, **(queue or {})},
        "pools": list(pools)
        if pools is not None
        else [{"name": "default", "max_in_flight": max_in_flight}],
        "routes": list(routes or ()),
        "saturation": dict(saturation) if saturation is not None else {"enabled": False},
    }
    if tiers is not None:
        doc["tiers"] = list(tiers)
    if tenants is not None:
        doc["tenants"] = list(tenants)
    return PolicyConfig.model_validate(doc)


def capacity_at(
    profile: EngineProfile, workload: Sequence[TraceRequest], replicas: int, concurrency: int
) -> Capacity:
    """Saturation throughput of ``replicas`` replicas each held at ``concurrency`` requests.

    The simulator's ``load=`` uses the engine's own limit (``max_num_seqs``); a gateway that
    caps in-flight requests lower has less capacity, so loads relative to that cap are
    rescaled with this instead.
    """
    return Capacity(replica_capacity(profile, workload, concurrency=concurrency), replicas)


def at_load(workload: Sequence[TraceRequest], load: float, cap: Capacity) -> list[TraceRequest]:
    """``workload`` with arrivals rescaled to ``load`` × ``cap``."""
    return scale_to_load(workload, load, cap)


def poisson_workload(lengths_from: Sequence[TraceRequest], n: int, seed: int) -> list[TraceRequest]:
    """``n`` Poisson arrivals (rate 1/s; rescale later) with (prompt, output) pairs resampled
    from ``lengths_from``."""
    times = Poisson(1.0).times(seed, count=n)
    return synthesize(times, TraceLengths(lengths_from), seed=seed + 1)


# --------------------------------------------------------------------------- statistics


def pctl(x: FloatArray | Sequence[float], q: float) -> float:
    """The ``q``-th percentile of the non-nan values of ``x`` (``nan`` if none)."""
    a = np.asarray(x, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(np.percentile(a, q)) if a.size else math.nan


def mean_of(x: FloatArray | Sequence[float]) -> float:
    """The mean of the non-nan values of ``x`` (``nan`` if none)."""
    a = np.asarray(x, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(a.mean()) if a.size else math.nan


def _fmt(x: float, digits: int) -> str:
    if math.isnan(x):
        return "–"
    if math.isinf(x):
        return "∞"
    return f"{x:.{digits}f}"


def f1(x: float) -> str:
    return _fmt(x, 1)


def f2(x: float) -> str:
    return _fmt(x, 2)


def f3(x: float) -> str:
    return _fmt(x, 3)


def pct(frac: float, digits: int = 1) -> str:
    """``0.334`` → ``33.4%``."""
    if math.isnan(frac):
        return "–"
    return f"{round(100.0 * frac, digits) + 0.0:.{digits}f}%"  # + 0.0: no "-0.0%"


# --------------------------------------------------------------------------- output


class Progress:
    """Numbered progress lines on stdout, with each step's wall time (stdout only)."""

    def __init__(self, tag: str, total: int) -> None:
        self.tag = tag
        self.total = total
        self.done = 0
        self._t0 = time.perf_counter()
        self._last = self._t0

    def step(self, label: str) -> None:
        now = time.perf_counter()
        self.done += 1
        print(
            f"[{self.tag} {self.done}/{self.total}] {label}  ({now - self._last:.1f} s)",
            flush=True,
        )
        self._last = now

    def finish(self) -> None:
        print(f"[{self.tag}] done in {time.perf_counter() - self._t0:.1f} s", flush=True)


@dataclass
class Report:
    """A study's REPORT.md: title, verdict, then sections of Markdown."""

    title: str
    verdict: str = ""
    parts: list[str] = field(default_factory=list)

    def h2(self, text: str) -> None:
        self.parts += [f"## {text}", ""]

    def h3(self, text: str) -> None:
        self.parts += [f"### {text}", ""]

    def para(self, text: str) -> None:
        self.parts += [text.strip(), ""]

    def bullets(self, items: Iterable[str]) -> None:
        self.parts += [f"- {i}" for i in items]
        self.parts.append("")

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.parts += [markdown_table(header, rows), ""]

    def image(self, caption: str, filename: str) -> None:
        self.parts += [f"![{caption}]({filename})", ""]

    def render(self) -> str:
        head = [f"# {self.title}", ""]
        if self.verdict:
            head += [self.verdict.strip(), ""]
        text = "\n".join(head + self.parts)
        return text.rstrip("\n") + "\n"

    def write(self, out_dir: Path) -> Path:
        path = out_dir / "REPORT.md"
        path.write_text(self.render(), encoding="utf-8")
        print(f"wrote {path}", flush=True)
        return path


def save_plot(fig: Figure, path: Path) -> None:
    """Save ``fig`` as a deterministic PNG and say so."""
    fig.tight_layout()
    save_figure(fig, path)
    print(f"wrote {path}", flush=True)
