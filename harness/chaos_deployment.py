"""The processes of one chaos run and the configuration they share.

A :class:`Deployment` is one ``redis-server`` (:class:`tests.support.redis_server.RedisServer`),
two ``velvetrope engine`` processes and two ``velvetrope serve`` gateways with the same
configuration (:func:`gateway_config`): state on that Redis, one pool over both engines with
a deployment-wide ``max_in_flight``, tiers ``interactive`` above ``batch`` in strict bands, four
tenants with token buckets (one of them small enough to bind).  Every process is started
here through :mod:`velvetrope.serving.launch` and stopped here by its own PID, never by
name; :meth:`Deployment.close` stops whatever still runs and is safe to call twice.

Each engine and gateway keeps a fixed port across restarts (a *slot*); every process that
ran in a slot is an :class:`Incarnation` with what the checks need of it afterwards: its
engine journal, when it was killed, its final ``/metrics`` and its stderr.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.redis_server import RedisServer
from velvetrope.gateway.api.admission_headers import TIMING_ENV
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess, free_port

__all__ = [
    "ADMIN_TOKEN",
    "MODEL",
    "TENANTS",
    "TOKENIZER",
    "Deployment",
    "DeploymentSpec",
    "Incarnation",
    "Slot",
    "Tenant",
    "gateway_config",
]

ADMIN_TOKEN = "chaos-admin-token"
MODEL = "velvetrope-sim"
TOKENIZER = "approx"
"""How the gateways and the engines count prompt tokens: the same way, so a prompt is
charged as the engine reports it (``approx``, the gateway's default, spares each process
the seconds ``bpe-openai`` takes to load its vocabularies)."""


@dataclass(frozen=True)
class Tenant:
    """A tenant of the run: its API key, tier and token bucket (capacity, refill per s)."""

    name: str
    tier: str
    tokens_per_minute: float
    token_burst: float

    @property
    def key(self) -> str:
        return f"sk-chaos-{self.name}"

    @property
    def bucket(self) -> str:
        """Its token bucket's claim key (``velvetrope.core.claims``)."""
        return f"tenant:{self.name}:tok"


TENANTS: tuple[Tenant, ...] = (
    Tenant("acme", "interactive", 6_000_000, 200_000),
    Tenant("globex", "interactive", 6_000_000, 200_000),
    Tenant("bulk", "batch", 6_000_000, 200_000),
    # binds: 100 tokens/s against the hundreds it is offered (429 rate_limited); full again
    # at most 4 s after the load (its debt floor is -200)
    Tenant("capped", "batch", 6_000, 200),
)
"""Every tenant has a token bucket: the gateway counts ``velvetrope_tokens_settled_total``
only for jobs that claim one."""


@dataclass(frozen=True)
class DeploymentSpec:
    """The knobs of a run's processes."""

    policy: str = "fail_open"
    max_in_flight: int = 12
    engine_speed: float = 1.0
    """Real time: requests of a few tens of tokens last a few tenths of a second, so the
    deployment's slots fill at the run's rate with few chunks (a client's, a gateway's and an
    engine's CPU goes mostly to chunks)."""
    lease_ttl_s: float = 3.0
    hold_ttl_s: float = 120.0
    drain_notice_s: float = 8.0
    call_timeout_ms: float = 50.0
    redis_empty: bool = False
    """Redis without persistence, so a restart comes back empty (the leases' re-assertion);
    otherwise ``appendonly yes`` with ``appendfsync always``, the persistence the usage
    ledger needs (``docs/concepts/quotas.md``): a restart keeps what was acknowledged."""


def gateway_config(
    port: int, engines: list[str], redis_url: str, namespace: str, spec: DeploymentSpec
) -> dict[str, Any]:
    """The configuration both gateways run (only ``listen.port`` differs)."""
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "admin_token": ADMIN_TOKEN,
        "api_keys": [{"tenant": t.name, "key": t.key} for t in TENANTS],
        "policy": {
            "tiers": [
                {"name": "interactive", "max_wait_s": 20.0, "min_share": 0.0},
                {"name": "batch", "max_wait_s": 30.0, "min_share": 0.0},
            ],
            # strict bands without a share: a batch job never leaves a pool's queue while an
            # interactive one waits there (priority_inversions counts the times it did)
            "queue": {"bands": "strict", "fairness": "vtc", "ordering": "sjf_aging"},
            "tenants": [
                {
                    "name": t.name,
                    "tier": t.tier,
                    "limits": {
                        "tokens_per_minute": t.tokens_per_minute,
                        "token_burst": t.token_burst,
                    },
                }
                for t in TENANTS
            ],
            "pools": [{"name": "default", "max_in_flight": spec.max_in_flight}],
            "estimator": {"reserve": "max_tokens"},
            "saturation": {"enabled": False},
        },
        "upstreams": {"default": [{"url": u} for u in engines]},
        "quotas": {"ledger": True},  # every settlement also counts in the ledger
        "gateway": {
            "tokenizer": TOKENIZER,
            "drain_grace_s": 20.0,
            "drain_notice_s": spec.drain_notice_s,
            "fleet": {"health_interval_s": 0.5, "breaker_failures": 3, "breaker_open_s": 1.0},
        },
        "state": {
            "url": redis_url,
            "namespace": namespace,
            "on_store_error": spec.policy,
            "call_timeout_ms": spec.call_timeout_ms,
            "heartbeat_s": 0.25,
            "breaker_reset_s": 0.5,
            "lease_ttl_s": spec.lease_ttl_s,
            "hold_ttl_s": spec.hold_ttl_s,
        },
    }


@dataclass
class Incarnation:
    """One process that ran in a slot."""

    proc: ServerProcess
    started_at: float
    journal: Path | None = None
    """The engine's journal (engines only)."""
    killed_at: float | None = None
    """``time.monotonic()`` just before it was sent SIGKILL (it was alive until then)."""
    metrics: str | None = None
    """Its last ``/metrics`` text, read once it had nothing left to do."""
    metrics_at: float | None = None
    stderr: str = ""
    stopped: bool = False

    def finish(self, timeout_s: float = 15.0) -> None:
        """Stop it if it runs (SIGINT, then SIGKILL after ``timeout_s``), keeping its
        stderr, what it wrote while shutting down included."""
        if self.stopped:
            return
        self.stopped = True
        p = self.proc.proc
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        with contextlib.suppress(Exception):
            self.stderr = self.proc.stderr_text()
        self.proc.stop()  # it has exited: this closes its log


@dataclass
class Slot:
    """A fixed port and the processes that ran there, the last one current."""

    name: str
    port: int = field(default_factory=free_port)
    runs: list[Incarnation] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def current(self) -> Incarnation:
        return self.runs[-1]


class Deployment:
    """Redis, two engines and two gateways for one policy (see the module docstring)."""

    def __init__(self, workdir: Path, spec: DeploymentSpec, namespace: str) -> None:
        self.workdir = workdir
        self.spec = spec
        self.namespace = namespace
        aof = [] if spec.redis_empty else ["--appendonly", "yes", "--appendfsync", "always"]
        self.redis = RedisServer(args=aof)
        self.engines = [Slot("engine-a"), Slot("engine-b")]
        self.gateways = [Slot("gateway-a"), Slot("gateway-b")]
        self.redis_started = False
        self._http = httpx.Client(verify=False)  # plain HTTP: no CA bundle to load
        self._http_lock = threading.Lock()  # one caller at a time (fault threads, the run)

    def config(self, gateway: Slot) -> dict[str, Any]:
        return gateway_config(
            gateway.port, [e.url for e in self.engines], self.redis.url, self.namespace, self.spec
        )

    # -- starting ----------------------------------------------------------------------

    def start(self) -> None:
        """Start everything: Redis, then the four processes side by side (a gateway is
        ready once an engine answers its health check); on failure stop what started."""
        try:
            self.redis.start()
            self.redis_started = True
            jobs = [(self.start_engine, e) for e in self.engines]
            jobs += [(self.start_gateway, g) for g in self.gateways]
            with ThreadPoolExecutor(len(jobs)) as pool:
                for done in [pool.submit(starter, slot) for starter, slot in jobs]:
                    done.result()
        except BaseException:
            self.close()
            raise

    def start_engine(self, slot: Slot) -> None:
        """A new engine process on ``slot``'s port, with a journal of its own."""
        journal = self.workdir / f"{slot.name}-{len(slot.runs)}.jsonl"
        args = ["--speed", str(self.spec.engine_speed), "--journal", str(journal)]
        args += ["--tokenizer", TOKENIZER]
        proc = launch.start_engine(*args, port=slot.port)
        slot.runs.append(Incarnation(proc, time.monotonic(), journal=journal))

    def start_gateway(self, slot: Slot) -> None:
        """A new gateway process on ``slot``'s port (timing headers on), once ready."""
        proc = launch.start_gateway(self.config(slot), self.workdir, env={TIMING_ENV: "1"})
        slot.runs.append(Incarnation(proc, time.monotonic()))

    # -- faults ---------------------------------------------------------------------------

    def kill(self, slot: Slot) -> float:
        """SIGKILL ``slot``'s process; returns the instant just before the signal."""
        inc = slot.current
        at = time.monotonic()
        inc.killed_at = at
        inc.proc.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            inc.proc.proc.wait(10)
        inc.finish()
        return at

    def terminate(self, slot: Slot) -> None:
        """SIGTERM ``slot``'s process (a gateway drains, then exits)."""
        slot.current.proc.proc.send_signal(signal.SIGTERM)

    def exited(self, slot: Slot) -> bool:
        return slot.current.proc.proc.poll() is not None

    # -- reading --------------------------------------------------------------------------

    def admin_status(self, gateway: Slot, timeout_s: float = 2.0) -> dict[str, Any]:
        """``/admin/status`` of ``gateway`` (raises httpx's errors)."""
        with self._http_lock:
            r = self._http.get(
                gateway.url + "/admin/status",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=timeout_s,
            )
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def scrape(self, slot: Slot, timeout_s: float = 2.0) -> str:
        """``/metrics`` of ``slot``'s current process (raises httpx's errors)."""
        with self._http_lock:
            r = self._http.get(slot.url + "/metrics", timeout=timeout_s)
        r.raise_for_status()
        return r.text

    def keep_final_metrics(self) -> list[str]:
        """Read the final ``/metrics`` of every live gateway and engine; the failures."""
        failed: list[str] = []
        for slot in self.gateways + self.engines:
            inc = slot.current
            if inc.stopped or inc.killed_at is not None:
                continue
            try:
                inc.metrics = self.scrape(slot)
                inc.metrics_at = time.monotonic()
            except httpx.HTTPError as e:
                failed.append(f"{slot.name}: {e!r}")
        return failed

    # -- stopping -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process still running: the gateways (side by side), then the engines,
        then Redis."""
        for slots in (self.gateways, self.engines):
            runs = [inc for slot in slots for inc in slot.runs]
            with ThreadPoolExecutor(max(1, len(runs))) as pool:
                for done in [pool.submit(inc.finish) for inc in runs]:
                    with contextlib.suppress(Exception):
                        done.result()
        if self.redis_started:
            with contextlib.suppress(Exception):
                self.redis.stop()
        self._http.close()
