"""Building a run from user-level options: the workload to replay and a default policy.

:func:`prepare_workload` loads a trace (a built-in name or a file), cuts it to a window or a
prefix, optionally replaces its arrival times by a synthetic process's (keeping the trace's
request mix, :func:`~velvetrope.sim.traffic.with_mix`), and assigns tenants from a
:class:`~velvetrope.sim.tenant_mix.TenantMix`.
:func:`default_policy` is the policy used when no config file is given: the ``hybrid`` preset,
one tier per tier named in the mix (in the mix's order, highest priority first; tenants
without a tier go to the lowest), each tenant in its tier, and one pool with 64 slots per
replica.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from velvetrope.core import PolicyConfig
from velvetrope.errors import PolicyError
from velvetrope.sim.arrivals import ArrivalProcess
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace
from velvetrope.sim.traffic import with_mix
from velvetrope.sim.workload import head, time_window

__all__ = ["SLOTS_PER_REPLICA", "default_policy", "parse_window", "prepare_workload"]

SLOTS_PER_REPLICA = 64
"""Default ``max_in_flight`` per replica when no config is given."""


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` in seconds (``0:600``)."""
    a, sep, b = text.partition(":")
    try:
        start, end = float(a), float(b)
    except ValueError:
        raise PolicyError(f"bad window {text!r}: expected START:END in seconds") from None
    if not sep or not (0 <= start < end):
        raise PolicyError(f"bad window {text!r}: expected 0 <= START < END")
    return start, end


def prepare_workload(
    trace: str,
    *,
    tenants: TenantMix | None = None,
    seed: int = 0,
    limit: int | None = None,
    window: tuple[float, float] | None = None,
    arrivals: ArrivalProcess | None = None,
    duration: float | None = None,
) -> list[TraceRequest]:
    """Load ``trace``, keep ``window`` (rebased to 0) then the first ``limit`` requests, and
    assign tenants from ``tenants`` (seeded).  With ``arrivals``, the requests arrive at that
    process's times over ``[0, duration)`` instead (``duration`` required), each a row of the
    trace drawn with replacement; the process and the draw are seeded by ``seed``.  An
    empty result raises PolicyError."""
    reqs: Sequence[TraceRequest] = load_trace(trace)
    if window is not None:
        reqs = time_window(reqs, window[0], window[1])
    if limit is not None:
        reqs = head(reqs, limit)
    if arrivals is not None:
        if duration is None:
            raise PolicyError("synthetic arrivals need a duration")
        rng = np.random.default_rng(seed)
        reqs = with_mix(arrivals.times(rng, duration=duration), reqs, rng)
    elif duration is not None:
        raise PolicyError("a duration goes with synthetic arrivals; use a window for a trace")
    if tenants is not None:
        reqs = tenants.assign(reqs, seed)
    if not reqs:
        raise PolicyError(f"no request of trace {trace!r} is left after the window and limit")
    return list(reqs)


def default_policy(
    tenants: TenantMix | None, replicas: int, preset: str = "hybrid"
) -> PolicyConfig:
    """The policy used without a config file (see the module docstring)."""
    tiers: list[str] = []
    for _, tier, _ in tenants.entries if tenants is not None else ():
        if tier is not None and tier not in tiers:
            tiers.append(tier)
    if not tiers:
        tiers = ["default"]
    listed = [
        {"name": name, "tier": tier}
        for name, tier, _ in (tenants.entries if tenants is not None else ())
        if tier is not None
    ]
    return PolicyConfig.model_validate(
        {
            "preset": preset,
            "tiers": [{"name": t} for t in tiers],
            "tenants": listed,
            "pools": [{"name": "default", "max_in_flight": SLOTS_PER_REPLICA * replicas}],
        }
    )
