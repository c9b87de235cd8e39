"""``make chaos``: two gateways on one Redis in front of two engines, under load, through
Redis, engine and gateway faults, with the invariants checked automatically.

Run as ``python -m harness.chaos [--policy fail_open|fail_closed|both] [--seconds S]
[--rate R] [--short] [--seed N]``.  For each policy (``state.on_store_error``) it starts one
``redis-server``, two ``velvetrope engine`` and two ``velvetrope serve`` processes
(:mod:`harness.chaos_deployment`), sends ``R`` requests per second for ``S`` seconds from real
httpx clients (:mod:`harness.chaos_load`: 70% streaming, 10% of clients hanging up early and
10% mid-stream, interactive and batch tenants, one whose token limit binds) while the faults
of :mod:`harness.chaos_faults` happen (``--short``: only a Redis restart), lets the deployment
settle, reads what it left (:mod:`harness.chaos_state`), stops every process it started, and
counts the invariants (:mod:`harness.chaos_checks`).

Every gateway keeps the usage ledger (``quotas.ledger``) in that Redis, which runs with the
persistence the ledger needs (``appendonly yes``, ``appendfsync always``: a restart keeps
what was acknowledged; ``--redis-empty``: none, a restart comes back empty and the ledger
is not checked).

Output: detail lines per policy (``chaos: ...``), and last, one verdict line per policy::

    chaos: policy=P requests=N status_500=K unfinished=K leaked_slots=K unsettled_reservations=K \
settle_mismatch=K inflight_over_limit=K priority_inversions=K ledger_mismatch=K

Exit status 0 iff every counter of every policy is 0 and nothing kept a check from being
made; 1 otherwise; 2 on a bad command line.  Ctrl-C stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from harness.chaos_checks import (
    Verdict,
    inflight,
    ledger,
    outcomes,
    priority,
    settlement,
    statuses,
)
from harness.chaos_deployment import Deployment, DeploymentSpec
from harness.chaos_faults import Event, play, schedule
from harness.chaos_load import Rotation, Shot, drive, plan
from harness.chaos_state import (
    JournalEntry,
    Sample,
    read_journal,
    read_ledger,
    read_redis,
    sample_states,
    state_context,
)
from tests.support.prometheus import metric_sum

__all__ = ["main", "run_policy"]

_BEHIND_MS = 1000.0
"""Sending later than this (p99) means this process did not get the CPU it needed."""

_LOG_MARKS = ("Traceback", "Future exception was never retrieved", "Task exception was never")


def say(line: str) -> None:
    print(f"chaos: {line}", flush=True)


async def _load(
    deployment: Deployment,
    shots: list[Shot],
    seconds: float,
    full: bool,
    events: list[Event],
    samples: list[Sample],
) -> float:
    """Drive the load, play the faults and sample the gateways' state; the load's start."""
    rotation = Rotation()
    for g in deployment.gateways:
        rotation.add(g.name, g.url, len(g.runs) - 1)
    started = asyncio.get_running_loop().create_future()
    load = asyncio.create_task(drive(shots, rotation, started=started.set_result))
    t0: float = await started
    faults = asyncio.create_task(play(schedule(full), deployment, rotation, t0, seconds, events))
    sampler = asyncio.create_task(sample_states(deployment, samples))
    try:
        await load
        await asyncio.wait_for(faults, timeout=120)
    finally:
        for task in (load, faults, sampler):
            task.cancel()
        await asyncio.gather(load, faults, sampler, return_exceptions=True)
        await rotation.close()
    return t0


def _idle(st: dict[str, Any]) -> bool:
    state = st.get("state", {})
    return (
        st["queued"] == 0
        and st["in_flight"] == 0
        and st["waiting_requests"] == 0
        and state.get("outbox") == 0
        and bool(state.get("up"))
    )


def _settle(deployment: Deployment, v: Verdict, bound_s: float = 30.0) -> dict[str, int]:
    """Wait (bounded) until both gateways are idle with empty outboxes and Redis up; the
    work each still has queued or in flight then."""
    deadline = time.monotonic() + bound_s
    statuses_: dict[str, dict[str, Any]] = {}
    while True:
        try:
            statuses_ = {g.name: deployment.admin_status(g) for g in deployment.gateways}
        except httpx.HTTPError as e:
            v.problems.append(f"/admin/status unreadable while settling: {e!r}")
            return {}
        if all(_idle(st) for st in statuses_.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    residue = {}
    for name, st in statuses_.items():
        residue[name] = st["queued"] + st["in_flight"] + st["waiting_requests"]
        v.details.append(f"{name}: state fallbacks {st['state'].get('fallbacks')}")
        if st["state"].get("outbox"):
            v.details.append(
                f"{name}: outbox still holds {st['state']['outbox']} after {bound_s:g}s"
            )
    return residue


def _leases_held(deployment: Deployment, v: Verdict) -> int:
    """Leases the gateways say they hold (Redis and local)."""
    held = 0
    for g in deployment.gateways:
        st = deployment.admin_status(g)["state"]
        n = sum(st.get("leases", {}).values()) + sum(st.get("local_leases", {}).values())
        if n:
            v.details.append(f"leaked_slots: {g.name} still holds {n} leases: {st}")
        held += n
    return held


def _redis_checks(deployment: Deployment, v: Verdict) -> None:
    """Holds at quiescence; then, once a lease TTL and every bucket's refill time have
    passed, leases and buckets."""
    ns = deployment.namespace
    first = read_redis(deployment.redis.port, ns)
    v.add(
        "unsettled_reservations",
        len(first.holds),
        f"holds left: {first.holds[:5]}" if first.holds else None,
    )
    refill = first.seconds_to_full()
    if refill > 30.0:
        v.problems.append(f"buckets need {refill:.0f}s to refill: not waited for")
    wait = max(deployment.spec.lease_ttl_s + 1.0, min(30.0, refill) + 0.5)
    time.sleep(wait)
    later = read_redis(deployment.redis.port, ns)
    live = later.live_leases
    v.add("leaked_slots", len(live), f"live leases after the TTL: {live[:5]}" if live else None)
    v.add("leaked_slots", _leases_held(deployment, v))
    levels = later.bucket_levels()
    short = {k: lv for k, lv in levels.items() if lv[0] < lv[1] - 1e-6}
    v.add(
        "unsettled_reservations",
        len(short),
        f"buckets not full after {wait:.1f}s: {short}" if short else None,
    )
    v.details.append(
        f"redis: {len(first.holds)} holds at quiescence; after {wait:.1f}s {len(live)} live "
        f"and {later.stale_leases} expired leases, {len(levels)} buckets of which "
        f"{len(short)} not full"
    )


def _journals(
    deployment: Deployment, v: Verdict
) -> tuple[list[JournalEntry], list[tuple[str, float, int, int]]]:
    entries: list[JournalEntry] = []
    totals: list[tuple[str, float, int, int]] = []
    for slot in deployment.engines:
        for i, inc in enumerate(slot.runs):
            if inc.journal is None:
                continue
            got, bad = read_journal(inc.journal, slot.name, i)
            if bad and inc.killed_at is None:
                v.problems.append(f"{slot.name}#{i}: {bad} unreadable journal lines")
            entries += got
            if inc.metrics is not None:
                m = metric_sum(inc.metrics, "vllm:prompt_tokens_total") + metric_sum(
                    inc.metrics, "vllm:generation_tokens_total"
                )
                ended = [e for e in got if e.end is not None]
                totals.append(
                    (
                        f"{slot.name}#{i}",
                        m,
                        sum(e.prefilled for e in ended),
                        sum(e.generated for e in ended),
                    )
                )
            elif inc.killed_at is None:
                v.problems.append(f"{slot.name}#{i}: final /metrics not read")
    return entries, totals


def _gateway_counters(
    deployment: Deployment, shots: Sequence[Shot], v: Verdict
) -> tuple[float, float]:
    """Terminal outcomes and settled tokens summed over every gateway process."""
    outcomes_total = settled = 0.0
    for slot in deployment.gateways:
        for i, inc in enumerate(slot.runs):
            if inc.metrics is None or inc.metrics_at is None:
                v.problems.append(f"{slot.name}#{i}: final /metrics not read")
                continue
            late = [
                s
                for s in shots
                if (s.gateway, s.incarnation) == (slot.name, i)
                and (s.head_at or 0) > inc.metrics_at
            ]
            if late:
                v.problems.append(f"{slot.name}#{i}: {len(late)} answers after its final /metrics")
            outcomes_total += metric_sum(inc.metrics, "velvetrope_requests_total")
            settled += metric_sum(inc.metrics, "velvetrope_tokens_settled_total")
    return outcomes_total, settled


def _logs(deployment: Deployment, v: Verdict) -> None:
    """Tracebacks and unretrieved exceptions in the processes' stderr (detail lines)."""
    for slot in deployment.gateways + deployment.engines:
        for i, inc in enumerate(slot.runs):
            marks = {m: inc.stderr.count(m) for m in _LOG_MARKS if m in inc.stderr}
            if marks:
                lines = [ln for ln in inc.stderr.splitlines() if "Error" in ln or "rror:" in ln]
                v.details.append(f"log {slot.name}#{i}: {marks}; e.g. {lines[:2]}")


def _attribute(deployment: Deployment, shots: Sequence[Shot]) -> None:
    """Credit each answer with a timing header to the process that wrote it (its pid): a
    request sent to a gateway about to exit may be answered by the one restarted on its
    port."""
    by_pid = {
        inc.proc.pid: (slot.name, i)
        for slot in deployment.gateways
        for i, inc in enumerate(slot.runs)
    }
    for s in shots:
        if s.timing is not None and s.timing[3] in by_pid:
            s.gateway, s.incarnation = by_pid[s.timing[3]]


def _peaks(deployment: Deployment) -> str:
    """Each engine process's ``velvetrope_engine_requests_peak`` as last read."""
    out = []
    for slot in deployment.engines:
        for i, inc in enumerate(slot.runs):
            peak = (
                "killed"
                if inc.metrics is None
                else f"{metric_sum(inc.metrics, 'velvetrope_engine_requests_peak'):.0f}"
            )
            out.append(f"{slot.name}#{i}={peak}")
    return ", ".join(out)


def _hangups(shots: Sequence[Shot], entries: Sequence[JournalEntry]) -> str:
    """Where the clients that hung up were: before any engine had their request, or at one."""
    reached = {e.request_id for e in entries}
    kinds: dict[str, int] = {}
    for s in shots:
        if s.outcome == "hung_up":
            where = "at an engine" if s.request_id in reached else "before an engine"
            key = f"{s.hangup} {where}"
            kinds[key] = kinds.get(key, 0) + 1
    return "hang-ups: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items()))


_SHOT_FIELDS = (
    "request_id", "at", "stream", "max_tokens", "prompt", "hangup", "hangup_after", "gateway",
    "incarnation", "sent_at", "head_at", "ended_at", "hung_up_at", "status", "code", "message",
    "chunks", "usage", "done", "timing", "outcome", "detail",
)  # fmt: skip
"""What ``--keep`` writes of each request (``shots.jsonl``), relative times unchanged."""


def _write_logs(deployment: Deployment) -> None:
    """Each process's stderr beside the journals (kept with ``--keep``)."""
    for slot in deployment.gateways + deployment.engines:
        for i, inc in enumerate(slot.runs):
            (deployment.workdir / f"{slot.name}-{i}.stderr").write_text(inc.stderr)


def run_policy(
    policy: str,
    seconds: float,
    rate: float,
    seed: int,
    full: bool,
    keep: bool = False,
    redis_empty: bool = False,
) -> Verdict:
    """One run under ``policy`` (see the module docstring); its verdict.  With ``keep``
    the run's directory (configs, journals, stderr) is left in place and named; with
    ``redis_empty`` Redis runs without persistence (a restart comes back empty, and the
    ledger is not checked)."""
    v = Verdict(policy)
    workdir = Path(tempfile.mkdtemp(prefix=f"vr-chaos-{policy}-"))
    spec = DeploymentSpec(policy=policy, redis_empty=redis_empty)
    deployment = Deployment(workdir, spec, f"chaos-{policy}-{uuid.uuid4().hex[:6]}")
    shots = plan(rate, seconds, seed, f"{policy}-{seed}")
    events: list[Event] = []
    samples: list[Sample] = []
    began = time.monotonic()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    ledger_totals: dict[str, int] | None = None
    try:
        deployment.start()
        start_s = time.monotonic() - began
        t0 = asyncio.run(_load(deployment, shots, seconds, full, events, samples))
        load_s = time.monotonic() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        residue = _settle(deployment, v)
        failed = deployment.keep_final_metrics()
        v.problems += [f"final /metrics: {f}" for f in failed]
        _redis_checks(deployment, v)
        ledger_totals = (
            None if spec.redis_empty else read_ledger(deployment.redis.port, deployment.namespace)
        )
    finally:
        deployment.close()
    sent = [s for s in shots if s.sent_at is not None]
    v.requests = len(sent)
    _attribute(deployment, shots)
    cpu_s = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    lag = sorted((s.sent_at or 0) - (t0 + s.at) for s in sent)
    p99 = lag[int(0.99 * (len(lag) - 1))] * 1000 if lag else 0.0
    if p99 > _BEHIND_MS:
        v.problems.append(
            f"the load generator sent p99 {p99:.0f} ms late (the box is too busy for "
            f"{rate:g}/s): client timeouts and disconnects are its own, not the deployment's"
        )
    v.details.append(
        f"load: {len(sent)} requests in {seconds:g}s ({len(sent) / seconds:.1f}/s asked "
        f"{rate:g}/s), sending late by p99 {p99:.0f} ms; processes up in {start_s:.0f}s, "
        f"{load_s:.0f}s until the last answer, run {time.monotonic() - began:.0f}s; the "
        f"clients used {cpu_s:.0f} s of CPU ({100 * cpu_s / load_s:.0f}% of a core)"
    )
    for ev in events:
        end = "" if ev.end is None else f"..{ev.end - t0:.1f}s"
        v.details.append(f"fault {ev.name} at {ev.start - t0:.1f}s{end} {ev.note}".rstrip())
    statuses(shots, v)
    gateway_outcomes, settled = _gateway_counters(deployment, shots, v)
    outcomes(shots, gateway_outcomes, residue, v)
    entries, totals = _journals(deployment, v)
    settlement(shots, entries, settled, totals, v)
    ledger(ledger_totals, settled, v)
    killed = {
        (slot.name, i): inc.killed_at
        for slot in deployment.engines
        for i, inc in enumerate(slot.runs)
        if inc.killed_at is not None
    }
    for at in inflight(shots, entries, killed, spec.max_in_flight, t0, v)[:4]:
        v.details.append(f"over at {at - t0:.2f}s: {state_context(samples, at, t0)}")
    v.details.append(f"engine peak gauges: {_peaks(deployment)}")
    v.details.append(_hangups(shots, entries))
    priority(shots, v)
    _logs(deployment, v)
    if keep:
        _write_logs(deployment)
        dump = [{k: getattr(s, k) for k in _SHOT_FIELDS} | {"tier": s.tier} for s in shots]
        (workdir / "shots.jsonl").write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in dump))
        v.details.append(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return v


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.chaos", description=__doc__.split("\n")[0])
    ap.add_argument("--policy", choices=["fail_open", "fail_closed", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=75.0, help="seconds of load per policy")
    ap.add_argument("--rate", type=float, default=60.0, help="requests per second")
    ap.add_argument("--seed", type=int, default=32)
    ap.add_argument("--short", action="store_true", help="one fault: a Redis restart")
    ap.add_argument("--keep", action="store_true", help="keep configs, journals and logs")
    ap.add_argument(
        "--redis-empty",
        action="store_true",
        help="Redis without persistence: restarted empty (the ledger is not checked)",
    )
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.rate <= 0:
        ap.error("--seconds and --rate must be positive")
    policies = ["fail_open", "fail_closed"] if args.policy == "both" else [args.policy]
    verdicts: list[Verdict] = []
    for policy in policies:
        say(f"policy={policy}: {args.seconds:g}s at {args.rate:g}/s ...")
        v = run_policy(
            policy, args.seconds, args.rate, args.seed, not args.short, args.keep,
            args.redis_empty,
        )  # fmt: skip
        for line in v.details:
            say(f"  [{policy}] {line}")
        for line in v.problems:
            say(f"  [{policy}] HARNESS PROBLEM: {line}")
        verdicts.append(v)
    for v in verdicts:
        print(v.line(), flush=True)
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
