"""The demo's workload through a peer gateway, SGLang's Shepherd Model Gateway (SMG) with
its priority scheduler, against velvetrope's gateway: real processes, the same engines.

Two ``velvetrope engine --scheduling priority`` (the demo's engines: ``llama3-8b-a100`` at
3× speed), the demo's workload (the Azure conversation trace at twice what the engines
serve, three tenants on the example config's three tiers, 20 s plus 12 s of drain), and
one run per gateway in front of them, each on idle engines:

* **velvetrope**: ``velvetrope serve`` with the example config unchanged (``make demo``'s
  first run);
* **smg**: ``smg launch`` with its priority scheduler on and nothing else set: each tenant
  its own key (``--tenant-api-key``), the tier as SMG's class header (``x-smg-priority``:
  the top tier ``interactive``, the next ``default``, the rest ``bulk``), each tenant's
  class as its ``max_class``;
* **smg, 96 slots**: the same with ``--max-concurrent-requests 96`` (what issue 39 measured:
  the slots velvetrope's earlier example config had) and every class's reserved floor 0
  (SMG's built-in floors exceed 96 slots, and its priority scheduler would not start);
* **smg, 96 slots, SLO timeouts**: and each class's ``queue_timeout_secs`` set from its
  tier's wait bound (``TierPolicy.wait_bound_s``: its TTFT, else its end-to-end time,
  rounded up to a whole second: SMG takes whole seconds), so that a request leaves SMG's
  queue when waiting has cost it its objective, as velvetrope's queue bounds in time do.

Prints, per run and tier, the requests within their SLO (the demo's definition,
:func:`velvetrope.demo.summary.summarize`), then per run the total, the tokens generated
for requests never completed, the requests turned away by status and code, and the answers
of status 200 that carried no token (a stream that ended empty: SMG's answer to a request
it preempted before its first byte, where velvetrope answers 503 ``preempted``), and the
top tier's TTFT p99 and TPOT p50 and p99 over its completed answers.  Ends with one line::

    peer: velvetrope=N smg_best=M best_run=NAME ratio=N/M

Run: ``make bench-peer`` (installs SMG, pinned, into ``.venv-peer``:
``requirements/peer.txt``; ``PEER_DRAIN=150`` to wait for every outcome), or
``.venv/bin/python bench/peer_gateway.py --smg PATH [--drain S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml

from velvetrope.config import load_config
from velvetrope.demo.live import Monitor
from velvetrope.demo.loadgen import replay
from velvetrope.demo.replay_config import DEFAULT_MODEL, ReplayConfig
from velvetrope.demo.replay_results import ReplayOutcome, ReplayResult
from velvetrope.demo.run import gateway_config, start_engines
from velvetrope.demo.settings import DemoSettings, read_config, tenant_keys
from velvetrope.demo.summary import summarize
from velvetrope.demo.workload import build_workload
from velvetrope.engine import load_profile
from velvetrope.serving import launch
from velvetrope.sim.metrics import config_slos, percentiles

SMG_CLASSES = ("interactive", "default", "bulk")
"""SMG's classes for the tiers, top tier first (the tiers past the third are ``bulk``)."""
SLOTS = 96
_FALLBACK = "falling back to legacy admission"
"""What SMG logs when its priority scheduler cannot start with the settings given."""


def smg_class(index: int) -> str:
    """SMG's class for the tier at ``index`` in ``policy.tiers``."""
    return SMG_CLASSES[min(index, len(SMG_CLASSES) - 1)]


_SMG_DEFAULTS: dict[str, tuple[int, float, int, int, int, bool]] = {
    "system": (32, 0.0, 64, 30, 5, True),
    "interactive": (128, 0.25, 256, 30, 5, True),
    "default": (0, 0.10, 512, 60, 30, False),
    "bulk": (0, 0.0, 1024, 300, 120, False),
}
"""SMG 1.13.0's built-in class settings (``ClassConfig::default_for``): reserved floor,
reserved share, queue size, queue timeout (s), starvation threshold (s), may preempt."""


def smg_yaml(
    tenant_class: Mapping[str, str], timeouts: Mapping[str, int] | None, slots: int | None
) -> dict[str, Any]:
    """SMG's priority-scheduler YAML: each tenant's ``max_class`` (SMG names a tenant that
    authenticated with its ``--tenant-api-key`` ``auth:TENANT``); with ``timeouts`` (class
    -> seconds) those classes' ``queue_timeout_secs``; with ``slots``, every class's
    reserved floor 0 (its reserved share kept): the built-in floors (32 + 128) exceed a
    capacity of fewer slots, and SMG then falls back to its admission without classes."""
    classes: dict[str, Any] = {}
    for name, (floor, share, size, timeout, starve, preempt) in _SMG_DEFAULTS.items():
        classes[name] = {
            "reserved_floor": 0 if slots is not None else floor,
            "reserved_per_slot": share,
            "queue_size": size,
            "queue_timeout_secs": (timeouts or {}).get(name, timeout),
            "starvation_threshold_secs": starve,
            "can_preempt": preempt,
        }
    return {
        "classes": classes,
        "tenant_policies": {f"auth:{t}": {"max_class": c} for t, c in tenant_class.items()},
    }


def start_smg(
    smg: Path,
    engine_urls: Sequence[str],
    keys: Mapping[str, str],
    config_path: Path,
    slots: int | None,
) -> launch.ServerProcess:
    """``smg launch`` on a free loopback port in front of ``engine_urls``, round-robin,
    its priority scheduler on with ``config_path``, each tenant's key; ready once it
    lists the engines' model."""
    port = launch.free_port()
    args = [
        "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
        "--worker-urls", *engine_urls,
        "--priority-scheduler-enabled", "--priority-scheduler-config", str(config_path),
        "--prometheus-port", str(launch.free_port()),
    ]  # fmt: skip
    for tenant, key in keys.items():
        args += ["--tenant-api-key", f"{tenant}:{key}"]
    if slots is not None:
        args += ["--max-concurrent-requests", str(slots)]
    # SMG logs to stdout, which launch.start drops: exec'd with stdout on stderr (its log)
    program = ["/bin/sh", "-c", 'exec "$@" 1>&2', "sh", str(smg), "launch"]
    proc = launch.start(args, f"http://127.0.0.1:{port}", "/health", program=program)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            models = httpx.get(proc.url + "/v1/models", timeout=1.0).json()
            if any(m.get("id") == DEFAULT_MODEL for m in models.get("data", [])):
                return proc
        time.sleep(0.2)
    proc.stop()
    raise RuntimeError(f"smg did not list {DEFAULT_MODEL} within 30 s")


def empty_answers(rr: ReplayResult) -> int:
    """Answers of status 200 that carried no token."""
    return sum(1 for r in rr.results if r.status == 200 and r.tokens == 0)


def latency(rr: ReplayResult, tier: str) -> tuple[float, float, float]:
    """TTFT p99 (s), TPOT p50 and p99 (ms; :attr:`RequestResult.tpot_s`, answers of two
    tokens or more) of ``tier``'s completed answers."""
    done = [r for r in rr.results if r.tier == tier and r.outcome is ReplayOutcome.COMPLETED]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [1000.0 * t for r in done if (t := r.tpot_s) is not None]
    (p99,) = percentiles(ttft, (99,))
    p50_tpot, p99_tpot = percentiles(tpot, (50, 99))
    return p99, p50_tpot, p99_tpot


def turned_away(rr: ReplayResult) -> Counter[str]:
    """Requests answered with an error status, by ``status code``."""
    return Counter(
        f"{r.status} {r.error_code or ''}".strip()
        for r in rr.results
        if r.status not in (0, 200) and r.outcome is not ReplayOutcome.COMPLETED
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smg", type=Path, required=True, help="the smg executable")
    ap.add_argument(
        "--drain",
        type=float,
        default=DemoSettings().drain_s,
        help="seconds each run waits for open requests after the window (the demo's 12: the "
        "bound; 150: every request's outcome is known, batch's 120 s objective included)",
    )
    args = ap.parse_args(argv)
    s = DemoSettings(live=False, drain_s=args.drain)
    base = read_config(s.config_path)
    keys = tenant_keys(base, s.config_path)
    policy = load_config(s.config_path).policy
    tiers = [t.name for t in policy.tiers]
    slos = config_slos(policy)
    tier_class = {t: smg_class(i) for i, t in enumerate(tiers)}
    tenant_class = {t.name: tier_class[t.tier] for t in policy.tenants if t.name in keys}
    timeouts: dict[str, int] = {}
    for t in policy.tiers:  # the first tier of each class sets its timeout
        bound = t.wait_bound_s  # how long velvetrope's queue holds a job of the tier
        if bound is not None:
            timeouts.setdefault(tier_class[t.name], max(1, math.ceil(bound)))
    wl = build_workload(s, 2 * load_profile(s.profile).max_num_seqs)
    bound_s = s.window_s + s.drain_s
    print(
        f"{len(wl.requests)} requests over {s.window_s:g} s ({wl.offered_rps:.1f}/s, "
        f"{wl.offered_rps / wl.capacity.engines_rps:.2f}× the engines); bound {bound_s:g} s; "
        f"classes {tier_class}; SLO timeouts {timeouts}"
    )
    plan: list[tuple[str, int | None, Mapping[str, int] | None]] = [
        ("smg", None, None),
        (f"smg, {SLOTS} slots", SLOTS, None),
        (f"smg, {SLOTS} slots, SLO timeouts", SLOTS, timeouts),
    ]
    results: dict[str, ReplayResult] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="velvetrope-peer-")))
        engines = start_engines(s, stack, "priority")
        urls = [e.url for e in engines]

        def run(name: str, url: str, headers: Mapping[str, Mapping[str, str]] | None) -> None:
            cfg = ReplayConfig(
                (url,),
                keys,
                deadline_s=bound_s,
                request_timeout_s=bound_s,
                max_connections=4096,
                tier_headers=headers,
            )
            asyncio.run(_idle_then_replay(name, urls, wl.requests, cfg, results))

        gw = launch.start_gateway(gateway_config(base, urls, None), tmp)
        stack.callback(gw.stop, 5.0)
        run("velvetrope", gw.url, None)
        gw.stop(5.0)
        headers = {t: {"x-smg-priority": c} for t, c in tier_class.items()}
        for i, (name, slots, touts) in enumerate(plan):
            path = tmp / f"smg-{i}.yaml"
            path.write_text(yaml.safe_dump(smg_yaml(tenant_class, touts, slots)))
            proc = start_smg(args.smg, urls, keys, path, slots)
            try:
                run(name, proc.url, headers)
                log = proc.stderr_text()
            finally:
                proc.stop(5.0)
            if _FALLBACK in log:
                raise RuntimeError(f"{name}: smg ran without its priority scheduler ({_FALLBACK})")
    print(f"\n{'run':32} " + " ".join(f"{t:>12}" for t in tiers) + "  in SLO  wasted  empty 200")
    totals: dict[str, int] = {}
    for name, rr in results.items():
        per = {x.tier: x.within_slo for x in summarize(name, rr.results, s.window_s, slos, tiers)}
        totals[name] = sum(per.values())
        away = ", ".join(f"{n}× {k}" for k, n in turned_away(rr).most_common()) or "none"
        print(
            f"{name:32} "
            + " ".join(f"{per[t]:>12}" for t in tiers)
            + f"  {totals[name]:>6}  {rr.tokens_wasted():>6}  {empty_answers(rr):>9}"
            + f"   turned away: {away}"
        )
    top = tiers[0]
    for name, rr in results.items():
        ttft99, tpot50, tpot99 = latency(rr, top)
        print(
            f"  {name}: {top} completed, TTFT p99 {ttft99:.2f} s, "
            f"TPOT p50 {tpot50:.0f} ms, p99 {tpot99:.0f} ms"
        )
    best = max((n for n in totals if n != "velvetrope"), key=lambda n: totals[n])
    print(
        f"peer: velvetrope={totals['velvetrope']} smg_best={totals[best]} "
        f"best_run={json.dumps(best)} ratio={totals['velvetrope'] / max(1, totals[best]):.2f}"
    )
    return 0


async def _idle_then_replay(
    name: str,
    engine_urls: Sequence[str],
    requests: Sequence[Any],
    cfg: ReplayConfig,
    out: dict[str, ReplayResult],
) -> None:
    """Wait (up to 30 s) for the engines to run nothing, then replay ``requests``."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        mon = Monitor(session, cfg.base_urls[0], None, engine_urls)
        if not await mon.wait_engines_idle(30.0):
            print(f"  engines still busy before the {name} run; going on")
    print(f"run: {name} ...", flush=True)
    out[name] = await replay(requests, cfg)


if __name__ == "__main__":
    raise SystemExit(main())
