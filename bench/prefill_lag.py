"""Where the gateway's engines fall behind the engines alone: prompt tokens prefilled over time.

For one workload of ``bench/policy_suite.py`` (``--workload NAME``, from its eight or its
held-out twelve; ``--seed N`` to draw its tenants again), the engines alone in priority mode
(``prio``) and the shipped config (``gateway``) are simulated as the suite does, and for
each moment ``t`` this prints the prompt tokens the engines had prefilled by ``t`` (the
prompts of the requests whose first token came by ``t``), the requests decoding at ``t``,
and the gateway's lag behind the engines alone.  The last line::

    prefill_lag: workload=NAME seed=N lag_max_tokens=L lag_max_at_s=T lag_at_window_end=E \
batch_by_bound_prio=P batch_by_bound_gateway=G

``L`` is the largest lag (at ``T`` s), ``E`` the lag when the window ends; ``P`` and ``G``
count the batch tier's requests completed by the bound (the window and the suite's drain).
A lag that forms in the first seconds and then holds steady is throughput the gateway's
engines did not use while the pool filled (the saturation rule's ramp, docs/concepts/
slo-limits.md); a lag that grows through the window is throughput the policy gives up.

Run: ``.venv/bin/python bench/prefill_lag.py --workload conv-2.0-four-engines`` (seconds).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import policy_suite as suite  # noqa: E402

from velvetrope.demo.settings import DEFAULT_CONFIG  # noqa: E402
from velvetrope.sim.metrics import JobRecords  # noqa: E402

CASES = ("prio", "gateway")


def prefilled(rec: JobRecords, t: float) -> int:
    """Prompt tokens of the requests whose first token came by ``t``."""
    return int(rec.prompt[rec.first_token <= t].sum())


def decoding(rec: JobRecords, t: float) -> int:
    """Requests past their first token and not ended at ``t``."""
    return int(((rec.first_token <= t) & ~(rec.end <= t)).sum())


def moments(window_s: float, bound_s: float) -> list[float]:
    """Every half second over the first 8 s (where a ramp shows), then every 2 s."""
    early = [0.5 * k for k in range(1, 17)]
    late = [float(t) for t in np.arange(10.0, bound_s + 1e-9, 2.0)]
    return sorted({*early, *late, window_s, bound_s})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [w.name for w in suite.WORKLOADS + suite.HELD_OUT]
    ap.add_argument("--workload", default="conv-2.0-four-engines", choices=names)
    ap.add_argument("--seed", type=int, default=None, help="the tenant draw (default: the suite's)")
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    args = ap.parse_args()
    w = next(x for x in suite.WORKLOADS + suite.HELD_OUT if x.name == args.workload)
    if args.seed is not None:
        w = replace(w, seed=args.seed)
    records: dict[str, JobRecords] = {}
    runs = suite.run(w, args.config, records)
    bound = w.window_s + suite.DRAIN_S
    print(f"{w.name} seed {w.seed}: prompt tokens prefilled by t (k), requests decoding at t")
    print(f"{'t (s)':>6}  {'prio':>14}  {'gateway':>14}  {'lag (k)':>8}")
    lag_max, lag_at = 0, 0.0
    lag_end = 0
    for t in moments(w.window_s, bound):
        p, g = (prefilled(records[k], t) for k in CASES)
        dp, dg = (decoding(records[k], t) for k in CASES)
        lag = p - g
        if lag > lag_max:
            lag_max, lag_at = lag, t
        if t == w.window_s:
            lag_end = lag
        print(f"{t:6.1f}  {p // 1000:7d}k {dp:5d}  {g // 1000:7d}k {dg:5d}  {lag / 1000:8.1f}")
    batch = {k: runs[k].result.tiers["batch"].in_slo for k in CASES}
    print(
        f"prefill_lag: workload={w.name} seed={w.seed} lag_max_tokens={lag_max} "
        f"lag_max_at_s={lag_at:g} lag_at_window_end={lag_end} "
        f"batch_by_bound_prio={batch['prio']} batch_by_bound_gateway={batch['gateway']}"
    )


if __name__ == "__main__":
    main()
