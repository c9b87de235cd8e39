"""The demo's workload: a trace window compressed to an overload of the engines' capacity.

Capacity is derived from the engine model the servers run
(:func:`velvetrope.sim.capacity.replica_capacity`), times ``speed``, times two engines.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace

from velvetrope.demo.settings import DemoSettings
from velvetrope.engine import load_profile
from velvetrope.errors import PolicyError
from velvetrope.sim.capacity import replica_capacity
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace
from velvetrope.sim.workload import scale_to_rate

__all__ = ["Capacity", "Workload", "build_workload"]


@dataclass(frozen=True, slots=True)
class Capacity:
    """Derived saturation throughput in requests per wall second, for two engines."""

    engines_rps: float
    gateway_rps: float
    slots_per_engine: int


@dataclass(frozen=True, slots=True)
class Workload:
    """The requests both runs replay, and what they offer."""

    requests: list[TraceRequest]
    offered_rps: float
    compression: float
    capacity: Capacity


def _capacity(s: DemoSettings, requests: Sequence[TraceRequest], max_in_flight: int) -> Capacity:
    profile = load_profile(s.profile)
    per_engine = replica_capacity(profile, requests, completions=2000)
    slots = max(1, max_in_flight // 2)
    behind = replica_capacity(
        profile, requests, concurrency=min(slots, profile.max_num_seqs), completions=2000
    )
    return Capacity(2 * per_engine * s.speed, 2 * behind * s.speed, slots)


def build_workload(s: DemoSettings, max_in_flight: int = 96) -> Workload:
    """The demo's requests: a trace window with tenants, compressed to ``overload`` × capacity.

    Requests from ``trace_start_s`` on, less those the engine cannot hold (prompt + output
    over the profile's ``max_model_len``; one in the whole ``azure_conv`` trace).  Capacity
    is derived from the first 3,000 of them; then just enough of them to fill ``window_s``
    are assigned tenants, rescaled to the target rate and cut at ``window_s``.
    """
    profile = load_profile(s.profile)
    trace = load_trace(s.trace)
    i0 = bisect_left([r.t for r in trace], s.trace_start_s)
    usable = [
        r for r in trace[i0:] if r.prompt_tokens + max(1, r.output_tokens) <= profile.max_model_len
    ]
    if len(usable) < 20:
        raise PolicyError(f"the trace has only {len(usable)} requests after trace_start_s")
    capacity = _capacity(s, usable[:3000], max_in_flight)
    target = s.overload * capacity.engines_rps
    need = int(target * s.window_s * 1.5) + 20  # enough to fill window_s at the target rate
    if len(usable) < need:
        raise PolicyError(
            f"the trace has {len(usable)} requests after trace_start_s; {need} are needed to "
            f"offer {target:.1f} req/s for {s.window_s:g}s: shorten the window or start earlier"
        )
    chunk = TenantMix.parse(s.mix).assign(usable[:need], s.seed)
    scaled = scale_to_rate(chunk, target)
    t0 = scaled[0].t
    requests = [replace(r, t=r.t - t0) for r in scaled if r.t - t0 < s.window_s]
    compression = (chunk[-1].t - chunk[0].t) / (scaled[-1].t - scaled[0].t)
    return Workload(requests, len(requests) / s.window_s, compression, capacity)
