"""Workloads drawn at random for ``bench/policy_suite.py --random N``: the policy on
workloads nobody chose, not even as held-out examples.

Each draw picks, independently and uniformly unless said:

* a trace (Azure 2023 conversation or code, Mooncake conversation) and a start in its first
  20 minutes (a multiple of 30 s);
* an engine profile among every one the package ships (8B and 70B models; A100 and H100;
  vLLM's V0 and V1 schedulers, whose seats and token budgets differ) and one to four
  engines;
* an overload of 1.1× to 3.5× of that pool's capacity (the suite states overloads against
  two engines, so the draw scales it by the engines drawn over two);
* a window of 15, 20, 30 or 40 s; three tenants, one per tier, with shares drawn from
  0.05–0.5 (top tier) and 0.1–0.6 (the others), normalised; the tenant-draw seed;
* the tight SLO set (a 50 ms TPOT on every tier with a TTFT objective) with probability
  0.3.

A draw the trace cannot supply at that rate (too few requests after its start) is drawn
again.  The tenants' rate limits are lifted (``tenant_limits=False``): they are contracts,
and a drawn rate can exceed the example's 6,000 requests a minute, where the gateway would
refuse what the engines alone serve and the comparison would be of the contract, not of
the capacity policy.  The same ``seed`` draws the same workloads.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

from velvetrope.errors import PolicyError

TRACES = ("azure_conv", "azure_code", "mooncake_conv")
PROFILES = (
    "llama3-8b-a100",
    "llama3-8b-a100-vllm-v0",
    "llama3-8b-h100",
    "llama3-8b-h100-vllm-v0",
    "llama3-8b-h100-vllm-v1",
    "llama3-70b-4xh100",
    "llama3-70b-4xh100-vllm-v0",
    "llama3-70b-4xh100-vllm-v1",
)
WINDOWS_S = (15.0, 20.0, 30.0, 40.0)
W = TypeVar("W")


def draw(
    n: int,
    seed: int,
    make: Callable[..., W],
    feasible: Callable[[W], bool],
) -> list[W]:
    """``n`` workloads drawn with ``seed``: ``make(**fields)`` builds one (the suite's
    ``Workload``), ``feasible`` says whether its trace can supply it; infeasible draws are
    drawn again (at most 50 tries per workload)."""
    rng = random.Random(seed)
    out: list[W] = []
    while len(out) < n:
        for _ in range(50):
            w = make(**_fields(rng, f"random-{len(out)}"))
            if feasible(w):
                out.append(w)
                break
        else:
            raise PolicyError(f"no feasible workload in 50 draws (seed {seed})")
    return out


def _fields(rng: random.Random, name: str) -> dict[str, object]:
    trace = rng.choice(TRACES)
    engines = rng.randint(1, 4)
    top, mid, low = rng.uniform(0.05, 0.5), rng.uniform(0.1, 0.6), rng.uniform(0.1, 0.6)
    total = top + mid + low
    a, b = round(top / total, 2), round(mid / total, 2)
    mix = f"acme:interactive:{a},globex:standard:{b},initech:batch:{round(1.0 - a - b, 2)}"
    return {
        "name": name,
        "trace": trace,
        "start_s": float(30 * rng.randrange(40)),
        "overload": round(rng.uniform(1.1, 3.5) * engines / 2, 2),
        "window_s": rng.choice(WINDOWS_S),
        "mix": mix,
        "seed": rng.randrange(1000),
        "tight_tpot": rng.random() < 0.3,
        "profile": rng.choice(PROFILES),
        "engines": engines,
        "tenant_limits": False,
    }
