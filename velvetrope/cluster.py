"""Where a sweep's points run: here, on a local process pool, or on a Dask cluster.

:func:`sweep_executor` opens a :class:`concurrent.futures.Executor` for
:func:`velvetrope.sim.sweep.run_sweep`: one process (``workers=1``: no executor, the points
run in this process), a local :class:`~concurrent.futures.ProcessPoolExecutor` (the
default, one worker per core), or, given a scheduler's address (``tcp://host:8786``), the
executor of a ``distributed.Client`` connected to that Dask cluster.  Whichever runs them,
every point is the same pure function of the same pickled inputs, so the results are
identical (tested byte for byte).

Why Dask rather than Ray, measured on this repository's 2-core machine with
``bench/sweep_engines_bench.py`` (2 worker processes, 200 no-op tasks, medians of 3 fresh
interpreters; Ray installed in a scratch virtualenv for the purpose):

=========  ==========  ===========  ==========  =================
engine     start-up    per task     shut-down   driver memory
=========  ==========  ===========  ==========  =================
pool       0.04 s      0.12 ms      0.01 s      17 MB
Dask       2.25 s      4.8 ms       0.73 s      65 MB
Ray        7.62 s      0.78 ms      1.37 s      105 MB
=========  ==========  ===========  ==========  =================

A sweep point is a simulation of seconds to minutes, so a few milliseconds per task are
noise while the start-up is paid by every sweep and every test run: Dask starts 3.4× faster
and uses less memory.  It also installs in 24 MB (dask + distributed) against Ray's 240 MB,
and its client hands out a :class:`concurrent.futures.Executor`, so the sweep code knows
nothing of it.  The local process pool stays the default: on one machine nothing beats it.

Large inputs that every point of a sweep shares (the workload: tens of thousands of
requests) travel as a :class:`~velvetrope.sim.shared.Shared`: pickled once by the driver,
shipped to each task as one opaque byte string (copied, not traversed), and unpickled at
most once per worker process, however many points that worker runs.

:class:`SweepTiming` is how a sweep's parallel speed is reported: the same runs timed one
after another and on the workers, as speedup, efficiency (speedup per worker) and the CPU
seconds the runs took, so that a slow parallel run can be told apart from a machine that
did not give the workers their cores.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from velvetrope.errors import PolicyError

__all__ = ["SweepTiming", "sweep_executor"]


@contextmanager
def sweep_executor(
    workers: int | None = None, cluster: str | None = None
) -> Iterator[Executor | None]:
    """The executor for a sweep (see the module docstring); closed on exit.

    ``workers``: processes of the local pool (default: the machine's cores; 1: none, run
    here).  ``cluster``: a Dask scheduler's address; ``workers`` must then be left out.
    """
    if cluster is not None:
        if workers is not None:
            raise PolicyError("give either a number of local workers or a cluster address")
        from distributed import Client

        try:
            client = Client(cluster, timeout="10s")
        except OSError as exc:
            raise PolicyError(f"cannot reach the Dask scheduler at {cluster}: {exc}") from None
        try:
            yield client.get_executor(pure=False)
        finally:
            client.close()
        return
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n < 1:
        raise PolicyError(f"workers must be >= 1, got {n}")
    if n == 1:
        yield None
        return
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["velvetrope.sim.loop"])
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        yield pool


@dataclass(frozen=True, slots=True)
class SweepTiming:
    """The same ``runs`` timed one after another and on ``workers`` processes.

    ``serial_s``/``parallel_s``: wall seconds of the whole sweep each way (the parallel one
    including the workers' start-up); ``serial_cpu_s``/``parallel_cpu_s``: the CPU seconds
    the runs themselves took, summed over runs (measured inside each run).  All must be
    ``> 0``, ``runs`` and ``workers`` ``>= 1``; a bad value raises
    :class:`~velvetrope.errors.PolicyError`.
    """

    runs: int
    workers: int
    serial_s: float
    parallel_s: float
    serial_cpu_s: float
    parallel_cpu_s: float

    def __post_init__(self) -> None:
        if self.runs < 1 or self.workers < 1:
            raise PolicyError(f"runs and workers must be >= 1, got {self.runs}, {self.workers}")
        for name in ("serial_s", "parallel_s", "serial_cpu_s", "parallel_cpu_s"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise PolicyError(f"{name} must be a finite number > 0, got {value!r}")

    @property
    def speedup(self) -> float:
        """``serial_s / parallel_s``."""
        return self.serial_s / self.parallel_s

    @property
    def efficiency(self) -> float:
        """``speedup / workers``: 1.0 when every worker did serial-speed work all along."""
        return self.speedup / self.workers

    @property
    def cpu_share(self) -> float:
        """``parallel_cpu_s / (workers * parallel_s)``: the share of the workers' cores the
        runs were on CPU during the parallel sweep (below 1: start-up, idle workers at the
        end, or cores taken by other processes)."""
        return self.parallel_cpu_s / (self.workers * self.parallel_s)

    def line(self) -> str:
        """``sweep: runs=.. workers=.. serial_s=.. parallel_s=.. speedup=.. efficiency=..
        cpu_per_run_serial_s=.. cpu_per_run_parallel_s=.. cpu_share=..`` (one line)."""
        return (
            f"sweep: runs={self.runs} workers={self.workers} serial_s={self.serial_s:.1f} "
            f"parallel_s={self.parallel_s:.1f} speedup={self.speedup:.2f} "
            f"efficiency={self.efficiency:.2f} "
            f"cpu_per_run_serial_s={self.serial_cpu_s / self.runs:.2f} "
            f"cpu_per_run_parallel_s={self.parallel_cpu_s / self.runs:.2f} "
            f"cpu_share={self.cpu_share:.2f}"
        )
