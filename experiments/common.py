"""Helpers shared by the studies: the fleet, policies, load scaling, statistics and reports.

Everything here is deterministic: no wall-clock time reaches a report (run times are printed
to stdout only), numbers are formatted with fixed precision and plots are saved without a
software stamp, so a study run twice writes the same bytes. The one line that names where a
report came from (its stamp, see ``Report.write``) changes only when the report's body or
one of its plots does, so rerunning an unchanged study on a fresh clone changes no file.
"""

from __future__ import annotations

import math
import re
import subprocess
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
from velvetrope.sim.length_models import TraceLengths
from velvetrope.sim.loop import scale_to_load
from velvetrope.sim.report import markdown_table, save_figure
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.workload import synthesize

__all__ = [
    "PROFILE_NAME",
    "STAMP_PREFIX",
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
    "split_stamp",
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
    64 slots per replica against an engine that runs 1,024).  Likewise a tier's queue is
    bounded in time only by its ``max_wait_s`` (``queue.wait_from_slo`` off unless
    ``queue`` says otherwise): the studies' baselines with no admission shed nothing.
    """
    doc: dict[str, Any] = {
        "preset": preset,
        "queue": {"max_queued": max_queued, "wait_from_slo": False, **(queue or {})},
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
        """Write ``out_dir/REPORT.md``: the rendered body with a stamp line under the title.

        The stamp reads ``Generated by `<command>` at commit <sha>.`` where ``<command>``
        reruns the study (``.venv/bin/python -m experiments.<out_dir's name>.run``). The
        rule, the only place it is applied: the stamp already in the file is kept when the
        body is unchanged and no plot in ``out_dir`` changed in this process (see
        ``save_plot``); otherwise it names the current commit, ``git rev-parse --short
        HEAD``, with ``-dirty`` appended when a tracked file outside the studies' outputs
        (everything under ``experiments/`` but ``.py`` files) has uncommitted changes, and
        ``unknown`` outside a git checkout. So a rerun that reproduces the committed report
        and plots leaves the file byte-identical, and a report that changed names the
        commit that produced it. Returns the path.
        """
        out_dir = out_dir.resolve()
        path = out_dir / "REPORT.md"
        body = self.render()
        old = path.read_text(encoding="utf-8") if path.exists() else None
        old_stamp, old_body = split_stamp(old) if old is not None else (None, None)
        if old_stamp is not None and old_body == body and out_dir not in _CHANGED_PLOTS:
            stamp = old_stamp
        else:
            stamp = _new_stamp(out_dir)
        text = _with_stamp(body, stamp)
        if text != old:
            path.write_text(text, encoding="utf-8")
        _WRITTEN_REPORTS.add(out_dir)
        print(f"wrote {path}", flush=True)
        return path


STAMP_PREFIX = "Generated by `"
"""How a report's stamp line (its third line, under the title) begins."""

_STAMP_RE = re.compile(r"^Generated by `[^`]+` at commit [0-9a-z-]+\.$")
_CHANGED_PLOTS: set[Path] = set()
"""Study directories in which ``save_plot`` changed a PNG during this process."""
_WRITTEN_REPORTS: set[Path] = set()
"""Study directories whose REPORT.md ``Report.write`` wrote during this process."""


def split_stamp(text: str) -> tuple[str | None, str]:
    """``(stamp line or None, the report without it)``: the inverse of ``_with_stamp``."""
    lines = text.split("\n")
    if len(lines) > 3 and _STAMP_RE.match(lines[2]) and lines[3] == "":
        return lines[2], "\n".join(lines[:2] + lines[4:])
    return None, text


def _with_stamp(body: str, stamp: str) -> str:
    lines = body.split("\n")
    return "\n".join([*lines[:2], stamp, "", *lines[2:]])


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def _is_output(path: str) -> bool:
    """A path (relative to the repository root) that the studies write."""
    return path.startswith("experiments/") and not path.endswith(".py")


def _commit(where: Path) -> str:
    """The short commit of the checkout holding ``where``, ``-dirty`` if tracked files other
    than the studies' outputs differ from it, ``unknown`` outside git."""
    sha = _git("rev-parse", "--short", "HEAD", cwd=where)
    if sha is None:
        return "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=where) or ""
    # porcelain v1: "XY path" or "XY old -> new"; paths are relative to the root
    changed = [line[3:].split(" -> ")[-1].strip('"') for line in status.splitlines()]
    dirty = any(not _is_output(p) for p in changed)
    return sha.strip() + ("-dirty" if dirty else "")


def _new_stamp(out_dir: Path) -> str:
    command = f".venv/bin/python -m experiments.{out_dir.name}.run"
    return f"{STAMP_PREFIX}{command}` at commit {_commit(out_dir)}."


def save_plot(fig: Figure, path: Path) -> None:
    """Save ``fig`` as a deterministic PNG and say so.

    A PNG whose bytes changed marks its directory's report for a new stamp (see
    ``Report.write``), also when the report was written before the plot.
    """
    fig.tight_layout()
    old = path.read_bytes() if path.exists() else None
    save_figure(fig, path)
    print(f"wrote {path}", flush=True)
    out_dir = path.resolve().parent
    if path.read_bytes() == old or out_dir in _CHANGED_PLOTS:
        return
    _CHANGED_PLOTS.add(out_dir)
    report = out_dir / "REPORT.md"
    if out_dir in _WRITTEN_REPORTS and report.exists():
        text = report.read_text(encoding="utf-8")
        stamp, body = split_stamp(text)
        fresh = _new_stamp(out_dir)
        if stamp != fresh:
            report.write_text(_with_stamp(body, fresh), encoding="utf-8")
