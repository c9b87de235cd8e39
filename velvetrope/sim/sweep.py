"""Sweeps: the same workload through several policies and loads, side by side.

A sweep is a cartesian product of values per key (:data:`SWEEP_KEYS`)::

    policy=fifo,sjf_aging,hybrid   load=0.6,0.8,1.0,1.3   lengths=oracle,estimator
    replicas=2,4                   router=least_loaded,round_robin

``policy`` replaces the config's preset (queue fields the config sets explicitly are kept);
the others override the matching :func:`~velvetrope.sim.loop.run_simulation` argument
(``seed=0,1,2`` repeats every point with other seeds).  Points are listed in the order the
keys and values were given, with a :mod:`rich` progress bar on stderr.  They run one after
another, or on any :class:`concurrent.futures.Executor` (a local process pool, a Dask
cluster's executor: :mod:`velvetrope.cluster`): each point is one task, a pure function of
its inputs, so the results — and the report — are the same bytes whichever runs them.  On an
executor the workload, which every point shares, travels as a
:class:`~velvetrope.sim.shared.Shared`: pickled once, unpickled once per worker process.  The
report has one row per point and, when ``load`` is swept, a latency-versus-load plot with
one curve per combination of the other keys.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from velvetrope.core import PolicyConfig, preset_names
from velvetrope.engine import EngineProfile
from velvetrope.errors import PolicyError
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.report import fmt_s, markdown_table, save_figure
from velvetrope.sim.result import SimResult
from velvetrope.sim.shared import Shared
from velvetrope.sim.trace_request import TraceRequest

__all__ = ["SWEEP_KEYS", "SweepResult", "parse_sweep", "run_sweep"]

SWEEP_KEYS = ("policy", "load", "lengths", "replicas", "router", "seed")


def parse_sweep(items: Sequence[str]) -> dict[str, list[str]]:
    """``["policy=fifo,sjf", "load=0.5,1"]`` → ``{"policy": [...], "load": [...]}``.

    Keys must be in :data:`SWEEP_KEYS` and appear once; values are checked when run
    (``policy`` against the presets, ``load``/``replicas`` as numbers) here already.
    """
    out: dict[str, list[str]] = {}
    for item in items:
        key, eq, vals = item.partition("=")
        key = key.strip()
        values = [v.strip() for v in vals.split(",") if v.strip()]
        if not eq or key not in SWEEP_KEYS or not values:
            raise PolicyError(
                f"bad sweep {item!r}: expected KEY=V1,V2,... with KEY in {SWEEP_KEYS}"
            )
        if key in out:
            raise PolicyError(f"sweep key {key!r} given twice")
        for v in values:
            _convert(key, v)
        out[key] = values
    return out


def _convert(key: str, value: str) -> Any:
    if key == "policy":
        if value not in preset_names():
            raise PolicyError(f"unknown policy {value!r}; presets: {', '.join(preset_names())}")
        return value
    if key in ("load", "replicas", "seed"):
        kind: type[float] | type[int] = float if key == "load" else int
        try:
            x = kind(value)
        except ValueError:
            raise PolicyError(f"bad {key} {value!r}: not a {kind.__name__}") from None
        if not (x >= 0 if key == "seed" else x > 0):
            raise PolicyError(f"{key} must be {'>= 0' if key == 'seed' else '> 0'}, got {value!r}")
        return x
    return value


@dataclass(frozen=True, slots=True)
class SweepResult:
    """The points of a sweep in run order: each its parameters (as given) and its result."""

    keys: tuple[str, ...]
    points: tuple[tuple[dict[str, str], SimResult], ...]

    def rows(self) -> list[list[str]]:
        """One table row per point: the swept values, then headline numbers."""
        out = []
        for params, res in self.points:
            rows = res.summary()
            top = rows[0]
            allr = rows[-1]
            rejected = allr.offered - allr.completed
            out.append(
                [
                    *(params[k] for k in self.keys),
                    f"{100 * allr.goodput_frac:.1f}%",
                    fmt_s(allr.e2e_mean),
                    fmt_s(allr.ttft[0]),
                    fmt_s(allr.ttft[2]),
                    f"{top.tier}: {fmt_s(top.ttft[2])}",
                    f"{100 * rejected / max(1, allr.offered):.1f}%",
                    f"{100 * res.busy_fraction():.1f}%",
                ]
            )
        return out

    def header(self) -> list[str]:
        return [
            *self.keys,
            "goodput",
            "mean e2e (s)",
            "TTFT p50 (s)",
            "TTFT p99 (s)",
            "top tier TTFT p99 (s)",
            "not completed",
            "GPU busy",
        ]

    def to_markdown(self, plot: str | None = None) -> str:
        """The sweep report; ``plot`` is the latency-vs-load image to link, if any."""
        first = self.points[0][1].info
        parts = [
            "# velvetrope simulation sweep",
            "",
            f"Workload {first.label} ({first.requests:,} requests), engine {first.profile}, "
            f"seed {first.seed}. Swept: "
            + "; ".join(
                f"{k} = {', '.join(dict.fromkeys(p[k] for p, _ in self.points))}" for k in self.keys
            )
            + ".",
            "",
            markdown_table(self.header(), self.rows()),
            "",
            "Goodput and latencies as defined in the single-run report (velvetrope.sim.metrics); "
            "latencies over completed requests, all tiers.",
        ]
        if plot is not None:
            parts += ["", f"![Latency versus load]({plot})"]
        return "\n".join(parts) + "\n"

    def plot(self) -> Figure | None:
        """Latency-vs-load curves (one per combination of the other keys), or ``None``
        when ``load`` was not swept."""
        if "load" not in self.keys:
            return None
        others = [k for k in self.keys if k != "load"]
        curves: dict[str, list[tuple[float, SimResult]]] = {}
        for params, res in self.points:
            name = ", ".join(params[k] for k in others) or "run"
            curves.setdefault(name, []).append((float(params["load"]), res))
        fig = Figure(figsize=(12, 3.8))
        axes = fig.subplots(1, 3)
        panels: list[tuple[str, Callable[[SimResult], float]]] = [
            ("mean e2e latency (s)", lambda r: r.overall().e2e_mean),
            ("p99 TTFT (s)", lambda r: r.overall().ttft[2]),
            ("goodput (share of offered)", lambda r: r.overall().goodput_frac),
        ]
        for ax, (label, fn) in zip(axes, panels, strict=True):
            for name, pts in curves.items():
                pts = sorted(pts, key=lambda p: p[0])
                ax.plot([p[0] for p in pts], [fn(p[1]) for p in pts], marker="o", label=name)
            ax.set_xlabel("offered load (× capacity)")
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
        axes[0].set_yscale("log")
        axes[1].set_yscale("log")
        axes[2].set_ylim(-0.02, 1.02)
        axes[0].legend(loc="upper left", fontsize="small")
        fig.suptitle("Latency and goodput versus load, per policy")
        fig.tight_layout()
        return fig

    def write_report(self, out_dir: str | Path) -> Path:
        """Write ``sweep.md`` (and ``latency_vs_load.png``) into ``out_dir``."""
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        fig = self.plot()
        name = None
        if fig is not None:
            name = "latency_vs_load.png"
            save_figure(fig, d / name)
        path = d / "sweep.md"
        path.write_text(self.to_markdown(name), encoding="utf-8")
        return path


def run_point(
    config: PolicyConfig,
    workload: Sequence[TraceRequest],
    profile: EngineProfile,
    params: Mapping[str, str],
    base: Mapping[str, Any] | None = None,
) -> SimResult:
    """One point of a sweep: ``base`` (``replicas`` default 4) overridden by ``params``.
    A module-level function, so an executor in another process can run it."""
    kw: dict[str, Any] = {"replicas": 4, **(base or {})}
    cfg = config
    for k, v in params.items():
        if k == "policy":
            cfg = config.model_copy(update={"preset": v})
        else:
            kw[k] = _convert(k, v)
    replicas = kw.pop("replicas")
    return run_simulation(cfg, workload, replicas, profile, **kw)


def run_shared_point(
    config: PolicyConfig,
    workload: Shared[Sequence[TraceRequest]],
    profile: EngineProfile,
    params: Mapping[str, str],
    base: Mapping[str, Any] | None = None,
) -> SimResult:
    """:func:`run_point` on a shared workload (what an executor's task runs)."""
    return run_point(config, workload.get(), profile, params, base)


def run_sweep(
    config: PolicyConfig,
    workload: Sequence[TraceRequest],
    profile: EngineProfile,
    sweep: Mapping[str, Sequence[str]],
    *,
    base: Mapping[str, Any] | None = None,
    progress: bool = True,
    executor: Executor | None = None,
) -> SweepResult:
    """Run every point of ``sweep`` (see :func:`parse_sweep`); ``base`` holds the other
    :func:`~velvetrope.sim.loop.run_simulation` keyword arguments (``replicas`` included,
    default 4).  ``executor`` runs the points (default: one after another, here);
    ``progress`` shows a rich progress bar on stderr.  The result lists the points in sweep
    order whatever order they finish in."""
    keys = tuple(sweep)
    if not keys:
        raise PolicyError("an empty sweep")
    for k, vals in sweep.items():
        if k not in SWEEP_KEYS or not vals:
            raise PolicyError(f"bad sweep key {k!r} or no values")
        for v in vals:
            _convert(k, v)
    points = [
        dict(zip(keys, values, strict=True))
        for values in itertools.product(*(sweep[k] for k in keys))
    ]
    results: list[SimResult | None] = [None] * len(points)
    bar = _Bar(len(points)) if progress else None
    try:
        if executor is None:
            for i, params in enumerate(points):
                if bar is not None:
                    bar.show(" ".join(f"{k}={v}" for k, v in params.items()))
                results[i] = run_point(config, workload, profile, params, base)
                if bar is not None:
                    bar.advance()
        else:
            shared: Shared[Sequence[TraceRequest]] = Shared(workload)
            futures: dict[Future[SimResult], int] = {
                executor.submit(run_shared_point, config, shared, profile, params, base): i
                for i, params in enumerate(points)
            }
            if bar is not None:
                bar.show(f"simulating on {type(executor).__name__}")
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if bar is not None:
                    bar.advance()
    finally:
        if bar is not None:
            bar.close()
    done = tuple((p, r) for p, r in zip(points, results, strict=True) if r is not None)
    return SweepResult(keys, done)


class _Bar:
    """A rich progress bar on stderr."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import Progress

        self._progress = Progress(console=Console(stderr=True), transient=False)
        self._progress.start()
        self._task = self._progress.add_task("simulating", total=total)

    def show(self, description: str) -> None:
        self._progress.update(self._task, description=description)

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()
