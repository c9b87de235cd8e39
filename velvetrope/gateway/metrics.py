"""Prometheus metrics of the gateway, in a registry of its own.

Names follow Prometheus conventions (``velvetrope_*``, seconds, ``_total``).  Gauges that
mirror the controller's state (queue depth, in flight, bucket fill) are computed at scrape
time from :meth:`AdmissionController.status`, so the request path pays nothing for them.

``velvetrope_queue_depth`` is what an autoscaler (KEDA) scales on; see the README.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from velvetrope.core import AdmissionController, Outcome
from velvetrope.core.request import JobState

__all__ = ["GatewayMetrics"]

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class _StateCollector(Collector):
    def __init__(self, ctl: AdmissionController) -> None:
        self._ctl = ctl

    def collect(self) -> Iterator[GaugeMetricFamily]:
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
        ledger = self._ctl.ledger
        if ledger is not None:
            for key, level in st["buckets"].items():
                b = ledger.get(key)
                if b is not None:
                    fill.add_metric([key], level / b.capacity)
        draining = GaugeMetricFamily("velvetrope_draining", "1 while draining.")
        draining.add_metric([], 1.0 if st["draining"] else 0.0)
        yield from (depth, qtok, infl, tinfl, drain, fill, draining)


class GatewayMetrics:
    """Counters and histograms fed by the controller's outcomes and the proxy."""

    def __init__(self, ctl: AdmissionController, tenant_label: bool = False) -> None:
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
        self.registry.register(_StateCollector(ctl))
        ctl.observers.append(self.on_outcome)

    def on_outcome(self, o: Outcome) -> None:
        """Count a terminal outcome (called by the controller, exactly once per job)."""
        job = o.job
        values = [job.tier, o.state.value, o.reason.code]
        if self.tenant_label:
            values.append(job.tenant)
        self.requests.labels(*values).inc()
        if o.state is not JobState.REJECTED:
            self.queue_wait.labels(job.tier).observe(job.queue_s)
        if job.first_token_at is not None:
            self.ttft.labels(job.tier).observe(job.first_token_at - job.arrival)
        if o.state is JobState.COMPLETED and job.finished_at is not None:
            self.e2e.labels(job.tier).observe(job.finished_at - job.arrival)
        # one token line per job (the first bucket), so tenant + tier buckets do not double
        tok = next((line for line in o.settlement.lines if line[0].endswith(":tok")), None)
        if tok is None:
            return
        _, reserved, actual = tok
        if reserved:
            self.reserved.labels(job.tier).inc(reserved)
        if actual:
            self.settled.labels(job.tier).inc(actual)

    def render(self) -> bytes:
        return generate_latest(self.registry)
