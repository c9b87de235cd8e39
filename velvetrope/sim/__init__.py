"""The simulator: the gateway's own admission core and the engine model in virtual time.

Entry points: :func:`~velvetrope.sim.loop.run_simulation` (a fleet replaying a workload,
returning a :class:`~velvetrope.sim.result.SimResult`), :func:`~velvetrope.sim.sweep.run_sweep`
and :func:`~velvetrope.sim.analytic.run_analytic` (one server, checked against closed forms).
Inputs: :mod:`velvetrope.sim.trace_request` (the request record),
:mod:`velvetrope.sim.length_models` (lengths), :mod:`velvetrope.sim.tenant_mix` (tenant
mixes), :mod:`velvetrope.sim.workload` (synthesis, transforms, statistics),
:mod:`velvetrope.sim.arrivals` (synthetic arrival processes) and :mod:`velvetrope.sim.traces`
(trace files and the built-in Azure traces).
"""

from velvetrope.sim.analytic import run_analytic
from velvetrope.sim.arrivals import (
    MMPP,
    ArrivalProcess,
    Deterministic,
    GammaRenewal,
    OnOff,
    Poisson,
)
from velvetrope.sim.length_models import (
    Empirical,
    Exponential,
    Fixed,
    IndependentLengths,
    LengthDist,
    LengthModel,
    LogNormal,
    TraceLengths,
)
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.result import SimResult
from velvetrope.sim.seeds import Seed, as_generator
from velvetrope.sim.sweep import run_sweep
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import (
    BUILTIN_TRACES,
    builtin_trace,
    load_trace,
    read_azure_csv,
    read_jsonl,
    write_jsonl,
)
from velvetrope.sim.workload import (
    TraceStats,
    head,
    index_of_dispersion,
    merge,
    rescale_time,
    scale_to_rate,
    synthesize,
    time_window,
    trace_stats,
)

__all__ = [
    "BUILTIN_TRACES",
    "MMPP",
    "ArrivalProcess",
    "Deterministic",
    "Empirical",
    "Exponential",
    "Fixed",
    "GammaRenewal",
    "IndependentLengths",
    "LengthDist",
    "LengthModel",
    "LogNormal",
    "OnOff",
    "Poisson",
    "Seed",
    "SimResult",
    "TenantMix",
    "TraceLengths",
    "TraceRequest",
    "TraceStats",
    "as_generator",
    "builtin_trace",
    "head",
    "index_of_dispersion",
    "load_trace",
    "merge",
    "read_azure_csv",
    "read_jsonl",
    "rescale_time",
    "run_analytic",
    "run_simulation",
    "run_sweep",
    "scale_to_rate",
    "synthesize",
    "time_window",
    "trace_stats",
    "write_jsonl",
]
