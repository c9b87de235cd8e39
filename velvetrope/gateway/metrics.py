"""Prometheus metrics of the gateway, in a registry of its own.

Names follow Prometheus conventions (``velvetrope_*``, seconds, ``_total``).  Gauges that
mirror the controller's state (queue depth, in flight, bucket fill) are computed at scrape
time from :meth:`AdmissionController.status`, so the request path pays nothing for them.

``velvetrope_queue_depth`` is what an autoscaler (KEDA) scales on; see the README.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from velvetrope.core import AdmissionController, Outcome, Reason
from velvetrope.core.request import JobState
from velvetrope.gateway.upstreams import UpstreamPools

__all__ = ["GatewayMetrics"]

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class _StateCollector(Collector):
    def __init__(self, ctl: AdmissionController, upstreams: UpstreamPools | None) -> None:
        self._ctl = ctl
        self._upstreams = upstreams
        self.state: Any = None

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
        for pool, p in st["pools"].items():
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
        state = self.state
        if state is not None and hasattr(state, "levels"):
            for key, (level, capacity) in state.levels().items():
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
        extra: list[Any] = [store_up]
        if state is not None:
            ss = state.status()
            store_up.add_metric([], 1.0 if ss.get("up") else 0.0)
            if ss.get("backend") == "redis":
                for decision, n in ss["fallbacks"].items():
                    fallbacks.add_metric([decision], n)
                replicas.add_metric([], ss["replicas"])
                fleet_depth.add_metric([], ss["fleet_queue_depth"])
                outbox.add_metric([], ss["outbox"])
                extra += [fallbacks, replicas, fleet_depth, outbox]
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
        if self._upstreams is not None:
            for u in self._upstreams.status():
                healthy.add_metric([str(u["pool"]), str(u["url"])], 1.0 if u["healthy"] else 0.0)
        yield from (depth, qtok, infl, tinfl, drain, fill, draining, bound, healthy, *extra)


class GatewayMetrics:
    """Counters and histograms fed by the controller's outcomes and the proxy."""

    def __init__(
        self,
        ctl: AdmissionController,
        tenant_label: bool = False,
        upstreams: UpstreamPools | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tenant_label = tenant_label
        labels = ["tier", "outcome", "reason"] + (["tenant"] if tenant_label else [])
        self.requests = Counter(
            "velvetrope_requests_total",
            "Requests by tier, outcome and reason.",
            labels,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "velvetrope_queue_wait_seconds",
            "Time from arrival to dispatch, by tier.",
            ["tier"],
            buckets=_LAT_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "velvetrope_time_to_first_token_seconds",
            "Time from arrival to the first token, by tier.",
            ["tier"],
            buckets=_LAT_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "velvetrope_e2e_request_latency_seconds",
            "Time from arrival to the last byte, by tier.",
            ["tier"],
            buckets=_LAT_BUCKETS,
            registry=self.registry,
        )
        self.reserved = Counter(
            "velvetrope_tokens_reserved_total",
            "Tokens reserved from buckets at admission, by tier.",
            ["tier"],
            registry=self.registry,
        )
        self.settled = Counter(
            "velvetrope_tokens_settled_total",
            "Tokens actually used at settlement, by tier.",
            ["tier"],
            registry=self.registry,
        )
        self.store_calls = Histogram(
            "velvetrope_state_call_seconds",
            "Latency of calls to shared state (Redis) as a request waits for them, by "
            "operation; op=round_trip: one pipelined round trip on the wire.",
            ["op"],
            buckets=(
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
            registry=self.registry,
        )
        self._store_children: dict[str, Any] = {}
        self._request_children: dict[tuple[str, JobState, Reason, str], Any] = {}
        self._tier_children: dict[str, tuple[Any, Any, Any, Any, Any]] = {}
        self._state_collector = _StateCollector(ctl, upstreams)
        self.registry.register(self._state_collector)
        ctl.observers.append(self.on_outcome)

    def attach_state(self, state: Any) -> None:
        """Report the state backend (``status()``, and ``levels()`` when local)."""
        self._state_collector.state = state

    def observe_store_call(self, op: str, seconds: float) -> None:
        child = self._store_children.get(op)
        if child is None:
            child = self._store_children[op] = self.store_calls.labels(op)
        child.observe(seconds)

    def on_outcome(self, o: Outcome) -> None:
        """Count a terminal outcome (called by the controller, exactly once per job)."""
        job = o.job
        key = (job.tier, o.state, o.reason, job.tenant if self.tenant_label else "")
        child = self._request_children.get(key)
        if child is None:
            values = [job.tier, o.state.value, o.reason.code]
            if self.tenant_label:
                values.append(job.tenant)
            child = self._request_children[key] = self.requests.labels(*values)
        child.inc()
        hs = self._tier_children.get(job.tier)
        if hs is None:
            t = job.tier
            hs = self._tier_children[t] = (
                self.queue_wait.labels(t),
                self.ttft.labels(t),
                self.e2e.labels(t),
                self.reserved.labels(t),
                self.settled.labels(t),
            )
        queue_wait, ttft, e2e, reserved_c, settled_c = hs
        if o.state is not JobState.REJECTED:
            queue_wait.observe(job.queue_s)
        if job.first_token_at is not None:
            ttft.observe(job.first_token_at - job.arrival)
        if o.state is JobState.COMPLETED and job.finished_at is not None:
            e2e.observe(job.finished_at - job.arrival)
        # one token line per job (the first token bucket), so tenant + tier do not double
        for c, (_, reserved, actual) in zip(job.claims, o.settlement.lines, strict=False):
            if c.kind == "tokens":
                if reserved:
                    reserved_c.inc(reserved)
                if actual:
                    settled_c.inc(actual)
                break

    def render(self) -> bytes:
        return generate_latest(self.registry)
