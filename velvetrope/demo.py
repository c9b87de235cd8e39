"""``velvetrope demo``: the same overload twice, through the gateway and straight to the engines.

What :func:`run_demo` does, in about 70 seconds with the defaults (two engines at ``speed`` 3
on the ``llama3-8b-a100`` profile: about 37 requests/s of the trace's mix, 6-7k streamed
tokens/s, which two shared cores can carry; the default H100 profile at speed 10 would be
~360 requests/s, far beyond them):

1. **Workload.**  A window of the Azure conversation trace (``azure_conv``, 2023; see
   ``velvetrope/data/traces/README.md``) from ``trace_start_s``, its requests assigned to the
   example config's three tenants (acme: interactive 20 %, globex: standard 30 %, initech:
   batch 50 %), and compressed in time so that the offered rate is ``overload`` × the
   engines' capacity for ``window_s`` seconds.
2. **Capacity** is derived from the engine model the servers run
   (:func:`velvetrope.sim.capacity.replica_capacity`: a closed-loop run of the batcher at
   full concurrency on the window's own length mix), times ``speed``, times two engines.  The
   capacity behind the gateway's slot limit (``max_in_flight`` spread over the engines) is
   derived the same way and shown too.  Both runs also *measure* throughput.
3. **Processes.**  Two ``velvetrope engine`` servers (``--profile``, ``--speed``) and
   ``velvetrope serve`` with the example config (``examples/gateway.yaml``) whose listen port
   and upstream URLs are rewritten to free loopback ports; everything on 127.0.0.1.
4. **Run 1** replays the workload open-loop (:mod:`velvetrope.loadgen`) through the gateway
   with each tenant's API key; **run 2** replays the same requests at the same times straight
   to the engines, round-robin, with no admission.  Each run lasts at most ``window_s +
   drain_s``: requests still open then are cut (and reported as such, never dropped).
5. **Live view** (rich) while each run goes: the loadgen's counters, the gateway's queue by
   band and in-flight count (``/admin/status``), the engines' running and waiting sequences
   (their vLLM ``/metrics``).
6. **Report:** one table, per tier and run: requests, completed, p50/p99 TTFT and end-to-end
   latency, rejected by reason, cut at the deadline, and goodput (requests completed within
   the tier's SLO, per second of the window; SLOs from the config's ``tiers[].slo`` and the
   simulator's definitions, :func:`slo_met`); and a PNG plot (``out_dir/demo.png``).

Latencies, SLOs and rates are **wall seconds at demo speed**: the engines run ``speed``
times faster than the modelled GPU.  Percentiles are over the requests that were not turned
away; a request cut at the deadline counts with the time it had waited, and a percentile
that lands on or above such a request is printed as a lower bound (``≥``).

Every process started is stopped (by its PID) when the demo ends, on error and on Ctrl-C.
Bad settings raise :class:`~velvetrope.errors.PolicyError`; a missing or unusable config
raises :class:`~velvetrope.errors.ConfigError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from velvetrope.config import load_config
from velvetrope.engine import load_profile
from velvetrope.errors import ConfigError, PolicyError
from velvetrope.loadgen import (
    LiveCounters,
    Outcome,
    ReplayConfig,
    ReplayResult,
    RequestResult,
    replay,
)
from velvetrope.serving import launch
from velvetrope.sim.capacity import replica_capacity
from velvetrope.sim.metrics import Slo, config_slos, slo_for
from velvetrope.sim.traces import load_trace
from velvetrope.sim.workload import TenantMix, TraceRequest, scale_to_rate

__all__ = [
    "DEFAULT_CONFIG",
    "Capacity",
    "DemoReport",
    "DemoSettings",
    "Percentile",
    "PhaseSample",
    "RunResult",
    "TierSummary",
    "Workload",
    "build_workload",
    "render_table",
    "run_demo",
    "slo_met",
    "summarize",
]

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "gateway.yaml"
"""The example config of a source checkout (``examples/gateway.yaml``)."""

GATEWAY = "gateway"
DIRECT = "direct"
RUNS = (GATEWAY, DIRECT)
_RUN_LABEL = {GATEWAY: "gateway", DIRECT: "direct (no admission)"}


def slo_met(r: RequestResult, slo: Slo) -> bool:
    """Whether ``r`` completed within ``slo``, with the simulator's definitions
    (:mod:`velvetrope.sim.metrics`): TTFT, TPOT = (e2e − TTFT) / (tokens − 1) (a one-token
    answer has no TPOT and passes) and e2e, each checked only when the SLO sets it."""
    if r.outcome is not Outcome.COMPLETED or r.ttft_s is None or r.e2e_s is None:
        return False
    if slo.ttft_s is not None and r.ttft_s > slo.ttft_s:
        return False
    tpot = (r.e2e_s - r.ttft_s) / (r.tokens - 1) if r.tokens >= 2 else None
    if slo.tpot_s is not None and tpot is not None and tpot > slo.tpot_s:
        return False
    return slo.e2e_s is None or r.e2e_s <= slo.e2e_s


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """Everything the demo can vary.  See the module docstring for what each step does.

    ``window_s``: seconds of offered load per run; ``drain_s``: extra seconds each run waits
    for open requests before cutting them.  ``overload``: offered rate over the engines'
    derived capacity.  ``preset``: replace the config's ``policy.preset`` (``None``: keep it).
    ``slos``: goodput's SLO per tier (``None``: the config's ``tiers[].slo``, else the
    simulator's default), in wall seconds at demo speed.  ``live``: draw the live view (only
    on a terminal; elsewhere a line every few seconds).
    """

    window_s: float = 20.0
    drain_s: float = 12.0
    speed: float = 3.0
    profile: str = "llama3-8b-a100"
    overload: float = 2.0
    trace: str = "azure_conv"
    trace_start_s: float = 600.0
    mix: str = "acme:interactive:0.2,globex:standard:0.3,initech:batch:0.5"
    seed: int = 7
    config_path: Path = DEFAULT_CONFIG
    preset: str | None = None
    out_dir: Path = Path("out")
    slos: Mapping[str, Slo] | None = None
    live: bool = True
    poll_s: float = 0.25

    def __post_init__(self) -> None:
        for name in ("window_s", "drain_s", "speed", "overload", "poll_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise PolicyError(f"{name} must be a number, got {v!r}")
            if not (math.isfinite(v) and v > 0):
                raise PolicyError(f"{name} must be finite and > 0, got {v!r}")
        if self.trace_start_s < 0:
            raise PolicyError(f"trace_start_s must be >= 0, got {self.trace_start_s}")

    @classmethod
    def quick(cls, **overrides: Any) -> DemoSettings:
        """A few seconds per run (tests, smoke checks): 2 s window, 3 s drain, no live view."""
        return replace(cls(**overrides), **{**_QUICK, **overrides})

    def as_quick(self) -> DemoSettings:
        """These settings with the quick run's window, drain and no live view."""
        return replace(self, **_QUICK)


_QUICK: Mapping[str, Any] = {"window_s": 2.0, "drain_s": 3.0, "live": False, "poll_s": 0.2}


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


@dataclass(frozen=True, slots=True)
class PhaseSample:
    """One poll of the servers during a run (``t``: seconds since the run started)."""

    t: float
    queued: Mapping[str, int]
    gateway_in_flight: int
    engine_running: int
    engine_waiting: int
    completed: int
    rejected: int


@dataclass(frozen=True, slots=True)
class Percentile:
    """A latency percentile; ``lower_bound`` when requests cut before the moment count."""

    value: float | None
    lower_bound: bool = False

    def __str__(self) -> str:
        if self.value is None:
            return "-"
        return f"{'≥' if self.lower_bound else ''}{self.value:.2f}"


@dataclass(frozen=True, slots=True)
class TierSummary:
    """One tier in one run (see :func:`summarize`)."""

    run: str
    tier: str
    requests: int
    completed: int
    rejected: Mapping[str, int]
    cut: int
    errors: int
    ttft_p50: Percentile
    ttft_p99: Percentile
    e2e_p50: Percentile
    e2e_p99: Percentile
    within_slo: int
    goodput_rps: float

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run: the loadgen's records and the samples polled while it went."""

    name: str
    replay: ReplayResult
    samples: list[PhaseSample]


@dataclass(frozen=True, slots=True)
class DemoReport:
    """What :func:`run_demo` measured: the table rows, the plot's path, the settings.

    ``pids``: the processes it started (all stopped by then).  ``problems``: what went wrong
    that the table alone would not explain (error answers, with the server's last log lines).
    """

    settings: DemoSettings
    workload_size: int
    offered_rps: float
    compression: float
    capacity: Capacity
    summaries: list[TierSummary]
    runs: Mapping[str, RunResult]
    plot_path: Path | None
    pids: list[int]
    slos: Mapping[str, Slo] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def summary(self, run: str, tier: str) -> TierSummary:
        """The row of ``tier`` in ``run`` (``"gateway"`` or ``"direct"``)."""
        for s in self.summaries:
            if s.run == run and s.tier == tier:
                return s
        raise KeyError((run, tier))

    def throughput(self, run: str) -> tuple[float, float]:
        """``(completed requests, completion tokens)`` per second of ``run``'s duration."""
        rr = self.runs[run].replay
        done = [r for r in rr.results if r.outcome is Outcome.COMPLETED]
        return len(done) / rr.duration_s, sum(r.tokens for r in done) / rr.duration_s


# --------------------------------------------------------------------------- workload


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: not found; the demo needs the example gateway config "
            "(examples/gateway.yaml of a source checkout) or --config FILE"
        ) from None
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def _tenant_keys(config: Mapping[str, Any], path: Path) -> dict[str, str]:
    """Plain API keys by tenant (hashed keys cannot be sent)."""
    keys: dict[str, str] = {}
    for entry in config.get("api_keys") or ():
        if isinstance(entry, dict) and isinstance(entry.get("key"), str):
            keys.setdefault(str(entry["tenant"]), entry["key"])
    if not keys:
        raise ConfigError(f"{path}: api_keys: the demo needs plain `key:` entries to send")
    return keys


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


# --------------------------------------------------------------------------- summaries


def _percentile(values: Sequence[tuple[float, bool]], q: float) -> Percentile:
    """Nearest-rank percentile of ``(value, censored)``; censored values are lower bounds."""
    if not values:
        return Percentile(None)
    ordered = sorted(values)
    k = max(0, math.ceil(q / 100.0 * len(ordered)) - 1)
    v = ordered[k][0]
    bound = any(c for _, c in ordered[: k + 1])
    return Percentile(v, bound)


def summarize(
    run: str,
    results: Sequence[RequestResult],
    window_s: float,
    slos: Mapping[str, Slo],
    tiers: Sequence[str],
) -> list[TierSummary]:
    """One :class:`TierSummary` per tier of ``tiers`` for the requests of one run.

    Latency percentiles are over requests not turned away (429/503) and not failed with
    another status: completed ones with their times, cut ones with the time they waited
    (censored).  Goodput is the number that met their tier's SLO over ``window_s``.
    """
    out: list[TierSummary] = []
    for tier in tiers:
        rs = [r for r in results if r.tier == tier]
        slo = slo_for(tier, slos)
        ttft: list[tuple[float, bool]] = []
        e2e: list[tuple[float, bool]] = []
        for r in rs:
            if r.outcome is Outcome.COMPLETED and r.e2e_s is not None:
                ttft.append((r.ttft_s if r.ttft_s is not None else r.e2e_s, False))
                e2e.append((r.e2e_s, False))
            elif r.outcome is Outcome.TIMEOUT and r.error_code != "not_sent":
                ttft.append((r.ttft_s, False) if r.ttft_s is not None else (r.elapsed_s, True))
                e2e.append((r.elapsed_s, True))
        rejected = Counter(
            r.error_code or str(r.status) for r in rs if r.outcome is Outcome.REJECTED
        )
        good = sum(1 for r in rs if slo_met(r, slo))
        out.append(
            TierSummary(
                run=run,
                tier=tier,
                requests=len(rs),
                completed=sum(1 for r in rs if r.outcome is Outcome.COMPLETED),
                rejected=dict(rejected.most_common()),
                cut=sum(1 for r in rs if r.outcome is Outcome.TIMEOUT),
                errors=sum(1 for r in rs if r.outcome in (Outcome.ERROR, Outcome.FAILED)),
                ttft_p50=_percentile(ttft, 50),
                ttft_p99=_percentile(ttft, 99),
                e2e_p50=_percentile(e2e, 50),
                e2e_p99=_percentile(e2e, 99),
                within_slo=good,
                goodput_rps=good / window_s,
            )
        )
    return out


def render_table(summaries: Sequence[TierSummary], slos: Mapping[str, Slo]) -> Table:
    """The final table: one row per tier and run."""
    table = Table(
        title="velvetrope demo: the same overload through the gateway and straight to the engines",
        title_justify="left",
        show_lines=False,
    )
    for name, justify in (
        ("tier / SLO", "left"),
        ("run", "left"),
        ("reqs", "right"),
        ("done", "right"),
        ("TTFT p50", "right"),
        ("TTFT p99", "right"),
        ("e2e p50", "right"),
        ("e2e p99", "right"),
        ("rejected (reason)", "left"),
        ("cut", "right"),
        ("in SLO", "right"),
        ("goodput/s", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    last_tier = None
    for s in summaries:
        first = s.tier != last_tier
        if first and last_tier is not None:
            table.add_section()
        last_tier = s.tier
        reasons = ", ".join(f"{k} {v}" for k, v in s.rejected.items())
        rejected = f"{s.rejected_total}" + (f" ({reasons})" if reasons else "")
        label = f"{s.tier}\n{slo_for(s.tier, slos)}" if first else ""
        table.add_row(
            label,
            _RUN_LABEL.get(s.run, s.run),
            str(s.requests),
            str(s.completed),
            str(s.ttft_p50),
            str(s.ttft_p99),
            str(s.e2e_p50),
            str(s.e2e_p99),
            rejected,
            f"{s.cut} +{s.errors} err" if s.errors else str(s.cut),
            str(s.within_slo),
            f"{s.goodput_rps:.2f}",
        )
    return table


# --------------------------------------------------------------------------- plot


def _plot(
    report_runs: Mapping[str, RunResult],
    summaries: Sequence[TierSummary],
    path: Path,
    tiers: Sequence[str],
    window_s: float,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(tiers, ("tab:red", "tab:blue", "tab:gray"), strict=False))
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    ymax = 1.0
    for run in RUNS:
        for r in report_runs[run].replay.results:
            if r.ttft_s is not None:
                ymax = max(ymax, r.ttft_s)
            elif r.outcome is Outcome.TIMEOUT:
                ymax = max(ymax, r.elapsed_s)
    for ax, run in zip(axes[0], RUNS, strict=True):
        res = report_runs[run].replay.results
        for tier in tiers:
            rs = [r for r in res if r.tier == tier]
            ok = [r for r in rs if r.ttft_s is not None]
            ax.scatter(
                [r.scheduled_s for r in ok],
                [r.ttft_s for r in ok],
                s=6,
                color=colors.get(tier),
                label=f"{tier} TTFT",
                alpha=0.6,
            )
            cut = [r for r in rs if r.ttft_s is None and r.outcome is Outcome.TIMEOUT]
            ax.scatter(
                [r.scheduled_s for r in cut],
                [r.elapsed_s for r in cut],
                s=10,
                marker="^",
                color=colors.get(tier),
                alpha=0.6,
            )
            rej = [r for r in rs if r.outcome is Outcome.REJECTED]
            ax.scatter(
                [r.scheduled_s for r in rej],
                [0.012] * len(rej),
                s=10,
                marker="x",
                color=colors.get(tier),
                alpha=0.5,
            )
        ax.set_yscale("log")
        ax.set_ylim(0.01, ymax * 1.5)
        ax.set_xlim(0, window_s)
        ax.set_xlabel("arrival time (s)")
        ax.set_ylabel("time to first token (s, log)")
        ax.scatter([], [], s=10, marker="^", color="black", label="cut before a token (waited)")
        ax.scatter([], [], s=10, marker="x", color="black", label="rejected (drawn at the bottom)")
        ax.set_title(f"{_RUN_LABEL[run]}: time to first token by arrival")
        ax.legend(loc="upper left", fontsize=7)
    ax = axes[1][0]
    g = report_runs[GATEWAY].samples
    if g:
        ts = [p.t for p in g]
        bands = list(g[0].queued)
        ax.stackplot(
            ts,
            *[[p.queued.get(b, 0) for p in g] for b in bands],
            labels=[f"gateway queue: {b}" for b in bands],
            colors=[colors.get(b, "tab:green") for b in bands],
            alpha=0.5,
        )
        ax.plot(ts, [p.gateway_in_flight for p in g], color="black", label="gateway in flight")
    d = report_runs[DIRECT].samples
    if d:
        ax.plot(
            [p.t for p in d],
            [p.engine_waiting + p.engine_running for p in d],
            color="tab:purple",
            linestyle="--",
            label="direct: in the engines (run + wait)",
        )
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("requests")
    ax.set_title("queues: gateway by band vs. engines without admission")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[1][1]
    width = 0.38
    xs = range(len(tiers))
    for i, run in enumerate(RUNS):
        vals = [
            next((s.goodput_rps for s in summaries if s.run == run and s.tier == t), 0.0)
            for t in tiers
        ]
        ax.bar(
            [x + (i - 0.5) * width for x in xs],
            vals,
            width,
            label=_RUN_LABEL[run],
            color=("tab:green" if run == GATEWAY else "tab:orange"),
        )
    ax.set_xticks(list(xs), list(tiers))
    ax.set_ylabel("completed within SLO per second")
    ax.set_title("goodput by tier")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- polling


def _parse_engine_metrics(text: str) -> dict[str, float]:
    """The vLLM gauges the live view shows, from an engine's Prometheus text."""
    wanted = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@dataclass(slots=True)
class _Monitor:
    """Polls the gateway's ``/admin/status`` and the engines' ``/metrics`` (1 s timeout each)."""

    session: aiohttp.ClientSession
    gateway_url: str
    admin_token: str | None
    engine_urls: Sequence[str]
    status: dict[str, Any] | None = None
    engines: list[dict[str, float]] = field(default_factory=list)

    async def _get(self, url: str, headers: Mapping[str, str] | None = None) -> bytes | None:
        try:
            async with self.session.get(url, headers=headers) as r:
                return await r.read() if r.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def poll(self) -> None:
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else None
        got = await asyncio.gather(
            self._get(self.gateway_url + "/admin/status", headers),
            *(self._get(u + "/metrics") for u in self.engine_urls),
        )
        if got[0] is not None:
            with contextlib.suppress(orjson.JSONDecodeError):
                self.status = orjson.loads(got[0])
        self.engines = [
            _parse_engine_metrics(b.decode("utf-8", "replace")) if b is not None else {}
            for b in got[1:]
        ]

    def bands(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pool in ((self.status or {}).get("pools") or {}).values():
            for band, b in (pool.get("bands") or {}).items():
                out[band] = out.get(band, 0) + int(b.get("queued", 0))
        return out

    def engine_sum(self, name: str) -> int:
        return int(sum(e.get(name, 0.0) for e in self.engines))

    async def wait_engines_idle(self, timeout_s: float) -> bool:
        """Poll until no engine runs or holds a request; False if still busy at the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await self.poll()
            if all(
                e
                and e.get("vllm:num_requests_running", 1) + e.get("vllm:num_requests_waiting", 1)
                == 0
                for e in self.engines
            ):
                return True
            await asyncio.sleep(0.2)
        return False


# --------------------------------------------------------------------------- live view


def _bar(n: int, full: int, width: int = 24) -> str:
    if full <= 0:
        return ""
    k = min(width, round(width * n / full))
    return "█" * k + "·" * (width - k)


def _view(
    title: str,
    elapsed: float,
    s: DemoSettings,
    live: LiveCounters,
    mon: _Monitor,
    band_limits: Mapping[str, int],
    gateway_run: bool,
) -> RenderableType:
    head = Text.assemble(
        (f"{title}", "bold"),
        f"   t = {elapsed:5.1f}s  (load for {s.window_s:g}s, then up to {s.drain_s:g}s drain)",
    )
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    rej = ", ".join(f"{k} {v}" for k, v in live.rejected.most_common()) or "0"
    t.add_row(
        "loadgen",
        f"sent {live.sent}/{live.total}   open {live.open}   completed {live.completed}   "
        f"rejected {sum(live.rejected.values())} ({rej})   cut {live.timeouts}   "
        f"errors {live.errors + live.failed}   tokens {live.tokens:,}",
    )
    if gateway_run:
        st = mon.status or {}
        bands = mon.bands()
        for band, n in bands.items():
            limit = band_limits.get(band, 0)
            t.add_row(f"queue {band}", f"{_bar(n, limit)} {n:4d}/{limit}")
        pools = st.get("pools") or {}
        inflight = sum(int(p.get("in_flight", 0)) for p in pools.values())
        cap = sum(int(p.get("max_in_flight", 0) or 0) for p in pools.values())
        t.add_row("in flight", f"{_bar(inflight, cap)} {inflight:4d}/{cap}")
        t.add_row(
            "gateway",
            f"admitted {live.accepted}   queued {st.get('queued', 0)}   "
            f"rejected {sum(live.rejected.values())}",
        )
    else:
        t.add_row("gateway", "bypassed: requests go round-robin straight to the engines")
    eng = "   ".join(
        f"engine {i + 1}: running {int(e.get('vllm:num_requests_running', 0)):3d} "
        f"waiting {int(e.get('vllm:num_requests_waiting', 0)):4d} "
        f"kv {100 * e.get('vllm:kv_cache_usage_perc', 0.0):3.0f}%"
        for i, e in enumerate(mon.engines)
    )
    t.add_row("engines", eng or "-")
    return Group(head, t)


# --------------------------------------------------------------------------- the runs


async def _run_phase(
    name: str,
    title: str,
    requests: Sequence[TraceRequest],
    rcfg: ReplayConfig,
    mon: _Monitor,
    s: DemoSettings,
    band_limits: Mapping[str, int],
    view: Live | None,
    console: Console,
) -> RunResult:
    live = LiveCounters()
    samples: list[PhaseSample] = []
    t0 = time.monotonic()
    task = asyncio.create_task(replay(requests, rcfg, live))
    last_line = -10.0
    try:
        while not task.done():
            await mon.poll()
            now = time.monotonic() - t0
            samples.append(
                PhaseSample(
                    t=now,
                    queued=mon.bands() if name == GATEWAY else {},
                    gateway_in_flight=int((mon.status or {}).get("in_flight", 0))
                    if name == GATEWAY
                    else 0,
                    engine_running=mon.engine_sum("vllm:num_requests_running"),
                    engine_waiting=mon.engine_sum("vllm:num_requests_waiting"),
                    completed=live.completed,
                    rejected=sum(live.rejected.values()),
                )
            )
            if view is not None:
                view.update(_view(title, now, s, live, mon, band_limits, name == GATEWAY))
                view.refresh()
            elif now - last_line >= 5.0:
                last_line = now
                console.print(
                    f"  {name} t={now:4.1f}s sent {live.sent}/{live.total} open {live.open} "
                    f"completed {live.completed} rejected {sum(live.rejected.values())} "
                    f"cut {live.timeouts}"
                )
            await asyncio.wait({task}, timeout=s.poll_s)
        result = task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return RunResult(name, result, samples)


async def _both_runs(
    s: DemoSettings,
    wl: Workload,
    gateway_url: str,
    engine_urls: Sequence[str],
    keys: Mapping[str, str],
    admin_token: str | None,
    band_limits: Mapping[str, int],
    console: Console,
) -> dict[str, RunResult]:
    bound = s.window_s + s.drain_s
    # Sockets: more than the ~1,250 requests open at once in the direct run, so that the
    # client's connection pool never queues requests itself (that would be admission).
    bounds: dict[str, Any] = {
        "deadline_s": bound,
        "request_timeout_s": bound,
        "max_connections": 4096,
    }
    runs: dict[str, RunResult] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        mon = _Monitor(session, gateway_url, admin_token, engine_urls)
        plan = (
            (
                GATEWAY,
                "run 1/2: through the gateway",
                ReplayConfig((gateway_url,), keys, **bounds),
            ),
            (
                DIRECT,
                "run 2/2: straight to the engines, no admission",
                ReplayConfig(tuple(engine_urls), "sk-direct", **bounds),
            ),
        )
        animate = s.live and console.is_terminal
        for name, title, rcfg in plan:
            if not animate:
                console.print(f"{title} ...")
            with Live(console=console, auto_refresh=False) if animate else _nothing() as view:
                runs[name] = await _run_phase(
                    name, title, wl.requests, rcfg, mon, s, band_limits, view, console
                )
            if name == GATEWAY and not await mon.wait_engines_idle(10.0):
                console.print("[yellow]engines still busy 10 s after run 1; going on[/]")
    return runs


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _start_engines(s: DemoSettings, stack: contextlib.ExitStack) -> list[launch.ServerProcess]:
    """Two engines, started in parallel; each registered in ``stack`` to be stopped."""
    args = ("--speed", f"{s.speed:g}", "--profile", s.profile)
    ex = ThreadPoolExecutor(2)
    futs = [ex.submit(launch.start_engine, *args) for _ in range(2)]
    try:
        wait(futs)
    finally:
        ex.shutdown(wait=True)  # after a Ctrl-C too: let the starts end so they can be stopped
        engines = []
        for f in futs:
            if not f.cancelled() and f.exception() is None:
                proc = f.result()
                stack.callback(proc.stop)
                engines.append(proc)
    for f in futs:
        err = f.exception()
        if err is not None:
            raise err
    return engines


def _gateway_config(
    base: Mapping[str, Any], engine_urls: Sequence[str], preset: str | None
) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(base)))  # a deep copy
    cfg["listen"] = {**(cfg.get("listen") or {}), "host": "127.0.0.1", "port": launch.free_port()}
    pools = list((cfg.get("upstreams") or {}).keys()) or ["default"]
    cfg["upstreams"] = {p: [{"url": u} for u in engine_urls] for p in pools}
    if preset is not None:
        cfg.setdefault("policy", {})["preset"] = preset
    return cfg


def _slo_text(slo: Slo, s: DemoSettings) -> str:
    run_s = s.window_s + s.drain_s
    if slo.e2e_s is not None and slo.e2e_s >= run_s:
        return f"{slo} (longer than a run of {run_s:g} s: any completion counts)"
    return str(slo)


def run_demo(settings: DemoSettings | None = None, console: Console | None = None) -> DemoReport:
    """Run the demo (see the module docstring), print its report and return it.

    Starts two engines and the gateway on loopback, runs the workload through the gateway,
    then straight to the engines, prints the table and writes the plot to
    ``settings.out_dir / "demo.png"``.  Every process started is stopped before returning,
    also when an error or Ctrl-C ends the demo early.
    """
    s = settings or DemoSettings()
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a file: do not squeeze the table
            console = Console(width=200)
    base = _read_config(s.config_path)
    keys = _tenant_keys(base, s.config_path)
    mix = TenantMix.parse(s.mix)
    missing = [t for t in mix.tenants if t not in keys]
    if missing:
        raise ConfigError(f"{s.config_path}: no plain API key for tenant(s) {missing}")
    policy = load_config(s.config_path).policy  # validated: errors name file and field
    tiers = [t.name for t in policy.tiers]
    band_limits = {t.name: t.max_queued or policy.queue.max_queued for t in policy.tiers}
    slots = sum(p.max_in_flight for p in policy.pools)
    slos: dict[str, Slo] = dict(s.slos) if s.slos is not None else config_slos(policy)
    wl = build_workload(s, slots)
    cap = wl.capacity
    console.print(
        f"[bold]velvetrope demo[/]: {len(wl.requests)} requests of the {s.trace} trace "
        f"(from {s.trace_start_s:g}s, compressed {wl.compression:.1f}×) over {s.window_s:g}s: "
        f"{wl.offered_rps:.1f} req/s offered\n"
        f"  capacity (derived from the engine model, {s.profile} at speed {s.speed:g}, 2 engines):"
        f" {cap.engines_rps:.1f} req/s  → offered = {wl.offered_rps / cap.engines_rps:.2f}×;"
        f" with the gateway's {slots} slots ({cap.slots_per_engine} per engine):"
        f" {cap.gateway_rps:.1f} req/s\n"
        f"  SLOs (wall s at demo speed, from {'the settings' if s.slos else 'the config'}): "
        + "; ".join(f"{t}: {_slo_text(slo_for(t, slos), s)}" for t in tiers)
    )
    pids: list[int] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="velvetrope-demo-")))
        t_start = time.monotonic()
        engines = _start_engines(s, stack)
        pids += [e.pid for e in engines]
        cfg = _gateway_config(base, [e.url for e in engines], s.preset)
        gw = launch.start_gateway(cfg, tmp)
        stack.callback(gw.stop, 5.0)
        pids.append(gw.pid)
        console.print(
            f"  started engines {[e.url for e in engines]} and gateway {gw.url} "
            f"(preset {cfg.get('policy', {}).get('preset')}) in {time.monotonic() - t_start:.1f}s"
        )
        runs = asyncio.run(
            _both_runs(
                s,
                wl,
                gw.url,
                [e.url for e in engines],
                keys,
                cfg.get("admin_token"),
                band_limits,
                console,
            )
        )
        problems = _problems(runs, gw, engines)
    summaries: list[TierSummary] = []
    for tier in tiers:
        for run in RUNS:
            summaries += summarize(run, runs[run].replay.results, s.window_s, slos, [tier])
    plot = _plot(runs, summaries, s.out_dir / "demo.png", tiers, s.window_s)
    report = DemoReport(
        settings=s,
        workload_size=len(wl.requests),
        offered_rps=wl.offered_rps,
        compression=wl.compression,
        capacity=cap,
        summaries=summaries,
        runs=runs,
        plot_path=plot,
        pids=pids,
        slos=slos,
        problems=problems,
    )
    _print_report(report, console)
    return report


def _problems(
    runs: Mapping[str, RunResult],
    gateway: launch.ServerProcess,
    engines: Sequence[launch.ServerProcess],
) -> list[str]:
    """Error answers per run, by status and code, with the servers' last stderr lines."""
    out: list[str] = []
    for run, procs in ((GATEWAY, [gateway]), (DIRECT, list(engines))):
        bad = Counter(
            (r.status, r.error_code or "")
            for r in runs[run].replay.results
            if r.outcome in (Outcome.ERROR, Outcome.FAILED)
        )
        if not bad:
            continue
        what = ", ".join(f"{n}× HTTP {st or '-'} {code}".rstrip() for (st, code), n in bad.items())
        out.append(f"{_RUN_LABEL[run]} run: error answers: {what}")
        for p in procs:
            tail = [ln for ln in p.stderr_text().splitlines() if ln.strip()][-6:]
            if tail:
                out.append(f"last stderr lines of pid {p.pid}:\n    " + "\n    ".join(tail))
    return out


def _print_report(report: DemoReport, console: Console) -> None:
    s = report.settings
    console.print(render_table(report.summaries, report.slos))
    for run in RUNS:
        rr = report.runs[run].replay
        rps, tps = report.throughput(run)
        cut_tokens = sum(r.tokens for r in rr.results if r.outcome is not Outcome.COMPLETED)
        good = sum(x.within_slo for x in report.summaries if x.run == run)
        console.print(
            f"  {_RUN_LABEL[run]:>22}: {rr.duration_s:4.1f}s, completed {rps:5.1f} req/s "
            f"({tps:,.0f} tokens/s), in SLO {good}/{len(rr.results)} "
            f"= {good / s.window_s:.1f}/s; tokens generated for requests never completed: "
            f"{cut_tokens:,}; loadgen max send lag {rr.max_send_lag_s * 1000:.0f} ms"
        )
    console.print(
        "  latencies in wall seconds from send; percentiles over requests not rejected; "
        "'≥' = lower bound (requests cut at the deadline count with the time they waited)"
    )
    for line in report.problems:
        console.print(f"  [bold red]problem:[/] {escape(line)}", highlight=False)
    console.print(f"  plot: {report.plot_path}")
