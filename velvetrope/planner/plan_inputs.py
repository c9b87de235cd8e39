"""``velvetrope plan``'s values resolved: durations, the default SLOs, and the inputs of the
measured-throughput planner (``--worker-rps``, ``--worker-tps``).

Errors are :class:`~velvetrope.errors.PolicyError` naming the option; the command prints
them as ``velvetrope plan: error: ...`` and exits with status 2.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from velvetrope.errors import PolicyError
from velvetrope.planner.words import figure as _n

if TYPE_CHECKING:
    from velvetrope.planner.measured import MeasuredPlan
    from velvetrope.planner.prediction import Metric
    from velvetrope.planner.workload import PlanWorkload

__all__ = ["DEFAULT_SLO", "measured_plan", "parse_duration"]

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|min|m|h)?\s*")

DEFAULT_SLO = {"interactive": "4s", "batch": "60s"}
"""The p99 bound of a tier when ``--slo-p99`` is not given."""


def parse_duration(text: str) -> float:
    """``"4s"``, ``"800ms"``, ``"1.5m"``, ``"2h"`` or a bare number of seconds → seconds (> 0)."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise PolicyError(f"bad duration {text!r}: expected a number with ms, s, m or h")
    value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not (math.isfinite(value) and value > 0):
        raise PolicyError(f"bad duration {text!r}: must be > 0")
    return value


def measured_plan(
    *,
    worker_rps: float | None,
    worker_tps: float | None,
    tokens_per_request: float | None,
    peak_rps: float | None,
    wl: PlanWorkload | None,
    tier: str,
    rho: float | None,
    concurrency: int | None,
    slo_p99: str | None,
    slo_metric: Metric,
) -> MeasuredPlan:
    """``plan --worker-rps/--worker-tps``: the measured-throughput planner's inputs resolved."""
    from velvetrope.planner.measured import plan_from_throughput
    from velvetrope.planner.plan import P99Target
    from velvetrope.planner.sizing import TIER_RHO

    if (worker_rps is None) == (worker_tps is None):
        raise PolicyError("give one of --worker-rps and --worker-tps, not both")
    if peak_rps is not None:
        lam, lam_origin = peak_rps, "given with --peak-rps"
    elif wl is not None:
        lam, lam_origin = wl.design_rps, wl.design_rate_origin
    else:
        raise PolicyError("give --peak-rps (or a --trace or --workload to take it from)")
    if worker_rps is not None:
        x, x_origin = worker_rps, "measured, given with --worker-rps"
    else:
        assert worker_tps is not None
        if not (math.isfinite(worker_tps) and worker_tps > 0):
            raise PolicyError(f"--worker-tps must be > 0 (got {worker_tps!r})")
        if tokens_per_request is not None:
            tok, tok_origin = tokens_per_request, "--tokens-per-request"
        elif wl is not None:
            tok, tok_origin = wl.mean_tokens, f"the mean prompt + output of {wl.source}"
        else:
            raise PolicyError("--worker-tps needs --tokens-per-request (or a --trace/--workload)")
        if not (math.isfinite(tok) and tok > 0):
            raise PolicyError(f"--tokens-per-request must be > 0 (got {tok!r})")
        x = worker_tps / tok
        x_origin = (
            f"measured {_n(worker_tps)} tok/s per worker (--worker-tps) / {_n(tok)} tokens per "
            f"request ({tok_origin})"
        )
    if rho is None:
        if tier not in TIER_RHO:
            raise PolicyError(f"no default utilisation for tier {tier!r}; give --rho")
        rho = TIER_RHO[tier]
    bound = slo_p99 if slo_p99 is not None else None
    if bound is None and concurrency is not None:
        bound = DEFAULT_SLO.get(tier)
    slo = None if bound is None else P99Target(slo_metric, parse_duration(bound))
    arrivals = "Poisson arrivals" if wl is None else f"the arrivals of {wl.source}"
    return plan_from_throughput(
        lam, x, rho_target=rho, tier=tier, design_rate_origin=lam_origin,
        per_worker_origin=x_origin, concurrency=concurrency, slo=slo,
        arrival_pattern=None if wl is None else wl.arrival_pattern, arrivals=arrivals,
    )  # fmt: skip
