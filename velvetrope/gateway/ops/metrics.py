"""Prometheus metrics of the gateway, in a registry of its own.

Names follow Prometheus conventions (``velvetrope_*``, seconds, ``_total``).  Gauges that
mirror the controller's state (queue depth, in flight, bucket fill) are computed at scrape
time from :meth:`AdmissionController.status`, so the request path pays nothing for them.

``velvetrope_queue_depth`` is what an autoscaler (KEDA) scales on; see
``docs/operations/metrics.md``.

The process itself: ``velvetrope_asyncio_tasks``, the tasks alive in the event loop that
serves the scrape (``len(asyncio.all_tasks())`` at scrape time; absent when the registry is
read outside a running loop), and prometheus_client's process collector
(``process_resident_memory_bytes``, ``process_open_fds``, ``process_cpu_seconds_total``, ...,
on Linux).  With ``--workers N`` each worker reports its own.  A leak shows as a slope in
them over hours (``make soak``).

The engines (:class:`~velvetrope.gateway.upstream.engines.Engines`, attached with
:meth:`GatewayMetrics.attach_engines`) add their upstreams', engines' and pools' families
(:mod:`velvetrope.gateway.ops.engine_metrics`), and the gateway counts routing decisions
(``pool``, ``rule``) and degradations (``tier``, ``action``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from velvetrope.core import AdmissionController, Job, Outcome, Reason
from velvetrope.core.lifecycle import JobState
from velvetrope.core.quota import is_ledger_key
from velvetrope.gateway.ops.counters import LoopCounter, LoopHistogram
from velvetrope.gateway.ops.engine_metrics import engine_families
from velvetrope.gateway.ops.series import CounterChild, OutcomeSeries, RequestCounting

__all__ = ["GatewayMetrics"]

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class _StateCollector(Collector):
    def __init__(self, ctl: AdmissionController) -> None:
        self._ctl = ctl
        self.engines: Any = None
        self.store: Any = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st = self._ctl.status()
        depth = GaugeMetricFamily(
            "velvetrope_queue_depth", "Requests waiting, by pool and band.", labels=["pool", "band"]
        )
        qtok = GaugeMetricFamily(
            "velvetrope_queue_tokens",
            "Tokens of queued work, by pool and band.",
            labels=["pool", "band"],
        )
        infl = GaugeMetricFamily(
            "velvetrope_in_flight",
            "Requests dispatched and not finished, by pool.",
            labels=["pool"],
        )
        tinfl = GaugeMetricFamily(
            "velvetrope_tokens_in_flight", "Reserved tokens in flight, by pool.", labels=["pool"]
        )
        drain = GaugeMetricFamily(
            "velvetrope_drain_tokens_per_second", "Measured drain rate, by pool.", labels=["pool"]
        )
        cap = GaugeMetricFamily(
            "velvetrope_pool_max_in_flight",
            "The pool's slots: per engine x live engines, or fixed.",
            labels=["pool"],
        )
        taken = CounterMetricFamily(
            "velvetrope_preemptions",
            "Requests taken back from an engine before their first token to make room for a "
            "higher tier (queued again, or 503 preempted), by pool (limit: slo pools only).",
            labels=["pool"],
        )
        for pool, p in st["pools"].items():
            cap.add_metric([pool], p["max_in_flight"])
            if p["preemptions"] is not None:
                taken.add_metric([pool], p["preemptions"])
            for band, b in p["bands"].items():
                depth.add_metric([pool, band], b["queued"])
                qtok.add_metric([pool, band], b["tokens"])
            infl.add_metric([pool], p["in_flight"])
            tinfl.add_metric([pool], p["tokens_in_flight"])
            if p["drain_tokens_per_s"] is not None:
                drain.add_metric([pool], p["drain_tokens_per_s"])
        fill = GaugeMetricFamily(
            "velvetrope_bucket_fill_ratio", "Bucket level / capacity.", labels=["bucket"]
        )
        store = self.store
        if store is not None:
            for key, (level, capacity) in store.levels().items():
                if not is_ledger_key(key):  # a ledger counter is no limit
                    fill.add_metric([key], level / capacity)
        store_up = GaugeMetricFamily(
            "velvetrope_state_up", "1 while shared state answers (always 1 for memory://)."
        )
        fallbacks = CounterMetricFamily(
            "velvetrope_state_fallback",
            "Decisions taken without shared state, by operation and policy.",
            labels=["decision"],
        )
        replicas = GaugeMetricFamily(
            "velvetrope_fleet_replicas", "Live gateway replicas (workers) seen via heartbeats."
        )
        fleet_depth = GaugeMetricFamily(
            "velvetrope_fleet_queue_depth",
            "Requests queued over every live replica, at the last heartbeat.",
        )
        outbox = GaugeMetricFamily(
            "velvetrope_state_outbox", "Settlements and releases waiting to reach shared state."
        )
        lost = CounterMetricFamily(
            "velvetrope_state_outbox_lost",
            "Settlements and releases given up: reason overflow (past the outbox's bound) or"
            " rejected (refused by shared state, e.g. a key of another type).",
            labels=["reason"],
        )
        deferred = CounterMetricFamily(
            "velvetrope_ledger_deferred",
            "Requests and tokens settled in the local fallback while shared state was away "
            "(on_store_error: fail_open), their usage-ledger counts sent to it through the "
            "outbox when it answers again (what the outbox gives up on is in "
            "velvetrope_state_outbox_lost_total), by kind.",
            labels=["kind"],
        )
        extra: list[Any] = [store_up]
        if store is not None:
            ss = store.status()
            store_up.add_metric([], 1.0 if ss.get("up") else 0.0)
            if ss.get("backend") == "redis":
                for decision, n in ss["fallbacks"].items():
                    fallbacks.add_metric([decision], n)
                replicas.add_metric([], ss["replicas"])
                fleet_depth.add_metric([], ss["fleet_queue_depth"])
                outbox.add_metric([], ss["outbox"])
                lost.add_metric(["overflow"], ss["outbox_dropped"])
                lost.add_metric(["rejected"], ss["outbox_rejected"])
                for kind in ("requests", "tokens"):
                    deferred.add_metric([kind], ss["ledger_deferred"].get(kind, 0))
                extra += [fallbacks, replicas, fleet_depth, outbox, lost, deferred]
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # read outside the event loop (a test, a thread)
            loop = None
        if loop is not None:
            tasks = GaugeMetricFamily(
                "velvetrope_asyncio_tasks", "Tasks alive in the gateway's event loop."
            )
            tasks.add_metric([], float(len(asyncio.all_tasks(loop))))
            extra.append(tasks)
        draining = GaugeMetricFamily("velvetrope_draining", "1 while draining.")
        draining.add_metric([], 1.0 if st["draining"] else 0.0)
        bound = GaugeMetricFamily(
            "velvetrope_queue_bound",
            "Queue bound by pool and band (band='*': the global bound across pools).",
            labels=["pool", "band"],
        )
        cfg = self._ctl.config
        bound.add_metric(["*", "*"], cfg.queue.max_queued)
        if cfg.queue.bands != "single":
            for pool in st["pools"]:
                for t in cfg.tiers:
                    if t.max_queued is not None:
                        bound.add_metric([pool, t.name], t.max_queued)
        healthy = GaugeMetricFamily(
            "velvetrope_upstream_healthy",
            "1 if the upstream passes its health check.",
            labels=["pool", "upstream"],
        )
        engines = self.engines
        if engines is not None:
            for u in engines.upstreams.status():
                healthy.add_metric([str(u["pool"]), str(u["url"])], 1.0 if u["healthy"] else 0.0)
            extra += engine_families(engines, self._ctl.clock.now())
        yield from (
            depth,
            qtok,
            infl,
            tinfl,
            drain,
            cap,
            taken,
            fill,
            draining,
            bound,
            healthy,
            *extra,
        )


class GatewayMetrics:
    """Counters and histograms fed by the controller's outcomes and the proxy."""

    def __init__(
        self,
        ctl: AdmissionController,
        tenant_label: bool = False,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tenant_label = tenant_label
        labels = ["tier", "outcome", "reason", "endpoint"] + (["tenant"] if tenant_label else [])
        self.requests = self._counter(
            "velvetrope_requests_total",
            "Requests by tier, outcome, reason and endpoint kind (chat, completions, "
            "responses, messages, embeddings, rerank, passthrough).",
            labels,
        )
        self.queue_wait = self._histogram(
            "velvetrope_queue_wait_seconds",
            "Time from arrival to dispatch, by tier.",
            ["tier"],
            _LAT_BUCKETS,
        )
        self.ttft = self._histogram(
            "velvetrope_time_to_first_token_seconds",
            "Time from arrival to the first token, by tier.",
            ["tier"],
            _LAT_BUCKETS,
        )
        self.e2e = self._histogram(
            "velvetrope_e2e_request_latency_seconds",
            "Time from arrival to the last byte, by tier.",
            ["tier"],
            _LAT_BUCKETS,
        )
        self.reserved = self._counter(
            "velvetrope_tokens_reserved_total",
            "Tokens reserved from buckets at admission, by tier and endpoint kind.",
            ["tier", "endpoint"],
        )
        self.settled = self._counter(
            "velvetrope_tokens_settled_total",
            "Tokens actually used at settlement, by tier and endpoint kind.",
            ["tier", "endpoint"],
        )
        self.store_calls = self._histogram(
            "velvetrope_state_call_seconds",
            "Latency of calls to shared state (Redis) as a request waits for them, by "
            "operation; op=round_trip: one pipelined round trip on the wire.",
            ["op"],
            (
                0.0001,
                0.00025,
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1.0,
            ),
        )
        self.routed = self._counter(
            "velvetrope_routed_total",
            "Routing decisions: the pool and the rule that chose it ('default': none matched).",
            ["pool", "rule"],
        )
        self.degraded = self._counter(
            "velvetrope_degraded_total",
            "Requests degraded before admission, by tier and action (max_tokens, pool).",
            ["tier", "action"],
        )
        self.shadow = self._counter(
            "velvetrope_shadow_decisions",
            "Shadow mode (enforce: false): the decision enforcement would have made for a "
            "request that was passed through (admitted, queued, rejected) and why (a "
            "rejection's code; 'capacity': it would have waited for a slot), by endpoint "
            "kind.",
            ["tier", "decision", "reason", "endpoint"],
        )
        self.reloads = self._counter(
            "velvetrope_config_reload",
            "Configuration reloads by result: ok, invalid (the running one kept), "
            "needs_restart (a setting that only a restart changes).",
            ["result"],
        )
        self.refused = self._counter(
            "velvetrope_refused_total",
            "Requests refused at the door, before admission: a missing or wrong API key "
            "(401), a malformed body (400), an unknown path (404) or method (405), a body "
            "too large (413) or too slow (408); endpoint: the admitted endpoint's name "
            "(chat, completions, embeddings, rerank, score, responses, messages, count_tokens; "
            "models for /v1/models; passthrough for a path gateway.other_paths passes), else "
            "'other'.",
            ["endpoint", "status", "code"],
        )
        self._store_children: dict[str, Any] = {}
        self._state_collector = _StateCollector(ctl)
        self.registry.register(self._state_collector)
        ProcessCollector(registry=self.registry)
        counting = RequestCounting(self._series, self._routed, self._degraded, tenant_label)
        self.on_route: Callable[[Job], None] = counting.on_route
        """Count a routing decision and its degradation actions (after ``ctl.route``)."""
        self.on_outcome: Callable[[Outcome], None] = counting.on_outcome
        """Count a terminal outcome (the controller's observer, exactly once per job)."""
        ctl.observers.append(counting.on_outcome)

    def attach_engines(self, engines: Any) -> None:
        """Report the engines (a :class:`~velvetrope.gateway.upstream.engines.Engines`)."""
        self._state_collector.engines = engines

    def _counter(self, name: str, doc: str, labels: list[str]) -> LoopCounter:
        c = LoopCounter(name, doc, labels)
        self.registry.register(c)
        return c

    def _histogram(
        self, name: str, doc: str, labels: list[str], buckets: tuple[float, ...]
    ) -> LoopHistogram:
        h = LoopHistogram(name, doc, labels, buckets)
        self.registry.register(h)
        return h

    def attach_store(self, store: Any) -> None:
        """Report the store (a :class:`~velvetrope.store.base.Store`: its ``status()`` and
        ``levels()``)."""
        self._state_collector.store = store

    def observe_store_call(self, op: str, seconds: float) -> None:
        child = self._store_children.get(op)
        if child is None:
            child = self._store_children[op] = self.store_calls.labels(op)
        child.observe(seconds)

    def _series(
        self, tier: str, state: JobState, reason: Reason, tenant: str, endpoint: str
    ) -> OutcomeSeries:
        values = [tier, state.value, reason.code, endpoint]
        if self.tenant_label:
            values.append(tenant)
        return (
            self.requests.labels(*values),
            self.queue_wait.labels(tier),
            self.ttft.labels(tier),
            self.e2e.labels(tier),
            self.reserved.labels(tier, endpoint),
            self.settled.labels(tier, endpoint),
        )

    def _routed(self, pool: str, rule: str) -> CounterChild:
        return self.routed.labels(pool, rule)

    def _degraded(self, tier: str, action: str) -> CounterChild:
        return self.degraded.labels(tier, action)

    def render(self) -> bytes:
        return generate_latest(self.registry)
