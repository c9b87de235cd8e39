"""Prometheus metrics of the engine server, with vLLM's names verbatim.

The gateway (and any dashboard built for vLLM) scrapes a ``velvetrope engine`` exactly like
a vLLM server.  Every series carries the label ``model_name``; the exposed sample names are:

=====================================================  =========  =================================
``vllm:num_requests_running``                          gauge      sequences in the running batch
``vllm:num_requests_waiting``                          gauge      sequences queued (incl. preempted)
``vllm:kv_cache_usage_perc``                           gauge      used / total KV blocks, 0..1
``vllm:num_preemptions_total``                         counter    preemptions (recompute)
``vllm:prompt_tokens_total``                           counter    prompt tokens prefilled
``vllm:generation_tokens_total``                       counter    output tokens generated
``vllm:prefix_cache_queries_total``                    counter    prompt tokens looked up (*)
``vllm:prefix_cache_hits_total``                       counter    prompt tokens found cached (*)
``vllm:spec_decode_num_draft_tokens_total``            counter    draft tokens proposed (*)
``vllm:spec_decode_num_accepted_tokens_total``         counter    draft tokens accepted (*)
``vllm:time_to_first_token_seconds{_bucket,_sum,_count}``  histogram  arrival -> first token
``vllm:e2e_request_latency_seconds{_bucket,_sum,_count}``  histogram  arrival -> last token
``vllm:request_queue_time_seconds{_bucket,_sum,_count}``   histogram  arrival -> first scheduled
``velvetrope_engine_requests_in_flight``              gauge      requests held now (**)
``velvetrope_engine_requests_peak``                    gauge      most requests held at once (**)
=====================================================  =========  =================================

(*) only when the stats source also implements :class:`CacheStats` (the real-time engine
does; the instant engine has no cache); vLLM's names as of its V1 engine.

Gauges and counters are read from an :class:`EngineStats` source at scrape time (no work
on the hot path); histograms are observed once per *completed* request, in wall-clock
seconds as the server measured them (like vLLM; the model's own predictions are reported
per request in the response's ``velvetrope`` field instead).

(**) only with a :class:`~velvetrope.engine.serve.journal.LoadStats` source (the server's
:class:`~velvetrope.engine.serve.journal.RequestLoad`, which says what "held" means): not
vLLM's, so named ``velvetrope_engine_*``.  The peak is a high-water mark since the server
started, never reset: an operator (or a harness) reading it knows that the engine never
held more requests at once than that, which sampling ``vllm:num_requests_running`` cannot
say.  Bucket bounds are vLLM's.
No ``_created`` series are exported.  Each server owns a private
:class:`~prometheus_client.CollectorRegistry`, so several engines can live in one process.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from velvetrope.engine.serve.journal import LoadStats

__all__ = [
    "CACHE_METRIC_NAMES",
    "CONTENT_TYPE",
    "E2E_BUCKETS",
    "LOAD_METRIC_NAMES",
    "METRIC_NAMES",
    "QUEUE_BUCKETS",
    "SAMPLE_NAMES",
    "TTFT_BUCKETS",
    "CacheStats",
    "EngineMetrics",
    "EngineStats",
    "Histogram",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of :meth:`EngineMetrics.render`'s output."""

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's bucket bounds for ``vllm:time_to_first_token_seconds``."""

E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's bucket bounds for its request latency histograms (e2e and queue time)."""

QUEUE_BUCKETS = E2E_BUCKETS

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = "vllm:kv_cache_usage_perc"
_PREEMPT = "vllm:num_preemptions"
_PROMPT = "vllm:prompt_tokens"
_GEN = "vllm:generation_tokens"
_PC_QUERIES = "vllm:prefix_cache_queries"
_PC_HITS = "vllm:prefix_cache_hits"
_SPEC_DRAFT = "vllm:spec_decode_num_draft_tokens"
_SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_HELD = "velvetrope_engine_requests_in_flight"
_PEAK = "velvetrope_engine_requests_peak"
_TTFT = "vllm:time_to_first_token_seconds"
_E2E = "vllm:e2e_request_latency_seconds"
_QUEUE = "vllm:request_queue_time_seconds"

METRIC_NAMES: tuple[str, ...] = (
    _RUNNING,
    _WAITING,
    _KV,
    _PREEMPT + "_total",
    _PROMPT + "_total",
    _GEN + "_total",
    _TTFT,
    _E2E,
    _QUEUE,
)
"""The metric names as vLLM exposes them (counters with their ``_total``)."""

CACHE_METRIC_NAMES: tuple[str, ...] = tuple(
    n + "_total" for n in (_PC_QUERIES, _PC_HITS, _SPEC_DRAFT, _SPEC_ACCEPTED)
)
"""The extra counters exported for a :class:`CacheStats` source."""

LOAD_METRIC_NAMES: tuple[str, ...] = (_HELD, _PEAK)
"""The gauges exported for a :class:`~velvetrope.engine.serve.journal.LoadStats` source."""

SAMPLE_NAMES: frozenset[str] = frozenset(
    [_RUNNING, _WAITING, _KV, _PREEMPT + "_total", _PROMPT + "_total", _GEN + "_total"]
    + [h + s for h in (_TTFT, _E2E, _QUEUE) for s in ("_bucket", "_sum", "_count")]
)
"""Every sample name :meth:`EngineMetrics.render` writes, and no other, plus
:data:`CACHE_METRIC_NAMES` for a :class:`CacheStats` source and :data:`LOAD_METRIC_NAMES`
for a load source."""


class EngineStats(Protocol):
    """What the gauges and counters read at scrape time."""

    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def prompt_tokens_total(self) -> int: ...
    @property
    def generation_tokens_total(self) -> int: ...


@runtime_checkable
class CacheStats(Protocol):
    """Prefix-cache and speculative-decoding counters (cumulative, tokens)."""

    @property
    def prefix_cache_queries(self) -> int: ...
    @property
    def prefix_cache_hits(self) -> int: ...
    @property
    def spec_draft_tokens(self) -> int: ...
    @property
    def spec_accepted_tokens(self) -> int: ...


class Histogram:
    """A lock-free cumulative histogram (single event loop; not thread-safe)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Record one value (seconds)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs as Prometheus expects, ending with ``+Inf``."""
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((repr(float(bound)), float(acc)))
        out.append(("+Inf", float(self.count)))
        return out


class _Collector(Collector):
    def __init__(self, owner: EngineMetrics) -> None:
        self._m = owner

    def collect(self) -> Iterator[Metric]:
        m = self._m
        s = m.stats
        labels = [m.model_name]
        families: tuple[tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, float], ...]
        families = (
            (GaugeMetricFamily, _RUNNING, "Number of requests in model execution batches.",
             s.num_running),
            (GaugeMetricFamily, _WAITING, "Number of requests waiting to be processed.",
             s.num_waiting),
            (GaugeMetricFamily, _KV, "KV-cache usage. 1 means 100 percent usage.", s.kv_usage),
            (CounterMetricFamily, _PREEMPT, "Cumulative number of preemption from the engine.",
             s.num_preemptions),
            (CounterMetricFamily, _PROMPT, "Number of prefill tokens processed.",
             s.prompt_tokens_total),
            (CounterMetricFamily, _GEN, "Number of generation tokens processed.",
             s.generation_tokens_total),
        )  # fmt: skip
        if isinstance(s, CacheStats):
            families += (
                (CounterMetricFamily, _PC_QUERIES,
                 "Prefix cache queries, in terms of number of queried tokens.",
                 s.prefix_cache_queries),
                (CounterMetricFamily, _PC_HITS,
                 "Prefix cache hits, in terms of number of cached tokens.", s.prefix_cache_hits),
                (CounterMetricFamily, _SPEC_DRAFT, "Number of draft tokens.",
                 s.spec_draft_tokens),
                (CounterMetricFamily, _SPEC_ACCEPTED, "Number of accepted tokens.",
                 s.spec_accepted_tokens),
            )  # fmt: skip
        load = m.load
        if load is not None:
            families += (
                (GaugeMetricFamily, _HELD, "Requests the engine holds now.", load.in_flight),
                (GaugeMetricFamily, _PEAK, "Most requests the engine held at once since it "
                 "started.", load.peak),
            )  # fmt: skip
        for family, name, doc, value in families:
            f = family(name, doc, labels=["model_name"])
            f.add_metric(labels, float(value))
            yield f
        for name, doc, hist in (
            (_TTFT, "Histogram of time to first token in seconds.", m.ttft),
            (_E2E, "Histogram of e2e request latency in seconds.", m.e2e),
            (_QUEUE, "Histogram of time spent in WAITING phase for request.", m.queue),
        ):
            h = HistogramMetricFamily(name, doc, labels=["model_name"])
            h.add_metric(labels, hist.buckets(), sum_value=hist.sum)
            yield h


class EngineMetrics:
    """The metrics of one engine server: a private registry over ``stats``.

    :meth:`observe_request` records a completed request's wall-clock queue time, TTFT and
    end-to-end latency; :meth:`render` returns the Prometheus text exposition.  With
    ``load``, the requests held now and their peak are exported too.
    """

    def __init__(self, model_name: str, stats: EngineStats, load: LoadStats | None = None) -> None:
        self.model_name = model_name
        self.stats = stats
        self.load = load
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(QUEUE_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def observe_request(self, queue_s: float, ttft_s: float, e2e_s: float) -> None:
        """Record one completed request (seconds, wall clock)."""
        self.queue.observe(queue_s)
        self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)

    def render(self) -> bytes:
        """The Prometheus text format (version 0.0.4) of every metric."""
        return generate_latest(self.registry)
