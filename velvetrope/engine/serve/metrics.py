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

**Other engines' dialects** (``velvetrope engine --metrics-dialect``, :data:`DIALECTS`), so
that a gateway can be tested against each engine family's names through HTTP: the same
numbers (running, waiting, KV usage 0..1, and the token counters where the engine has them)
under another engine's names and labels, and nothing of vLLM's.  ``vllm-old``: vLLM's, with
the KV gauge under its older name ``vllm:gpu_cache_usage_perc``; ``sglang``:
``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``,
``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total`` (label ``model_name``);
``tgi``: ``tgi_batch_current_size``, ``tgi_queue_size`` (no labels, no KV gauge);
``trtllm`` (trtllm-serve): ``trtllm_num_requests_running``, ``trtllm_num_requests_waiting``,
``trtllm_kv_cache_utilization`` (label ``model_name``); ``triton`` (Triton's TensorRT-LLM
backend): ``nv_trt_llm_request_metrics`` with ``request_type`` ``waiting``, ``scheduled``
and ``active`` (their sum), ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=
"fraction"}`` (labels ``model="tensorrt_llm"``, ``version="1"``); ``llamacpp``:
``llamacpp:requests_processing``, ``llamacpp:requests_deferred``,
``llamacpp:kv_cache_usage_ratio``, ``llamacpp:prompt_tokens_total``,
``llamacpp:tokens_predicted_total`` (no labels); ``none``: no ``/metrics`` at all (404).
Names as each engine's documentation gives them (see :mod:`velvetrope.dialects`).

Gauges and counters are read from an :class:`EngineStats` source at scrape time (no work
on the hot path); histograms are observed once per *completed* request, in wall-clock
seconds as the server measured them (like vLLM; the model's own predictions are reported
per request in the response's ``velvetrope`` field instead).

(**) only with a :class:`~velvetrope.engine.serve.journal.LoadStats` source (the server's
:class:`~velvetrope.engine.serve.journal.RequestLoad`, which says what "held" means), in
vLLM's dialects (``vllm``, ``vllm-old``): not vLLM's, so named ``velvetrope_engine_*``.
The peak is a high-water mark since the server started, never reset: an operator (or a
harness) reading it knows that the engine never held more requests at once than that,
which sampling ``vllm:num_requests_running`` cannot say.  Bucket bounds are vLLM's.
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
from velvetrope.errors import ConfigError

__all__ = [
    "CACHE_METRIC_NAMES",
    "CONTENT_TYPE",
    "DIALECTS",
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
_KV_OLD = "vllm:gpu_cache_usage_perc"
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


DIALECTS: tuple[str, ...] = (
    "vllm", "vllm-old", "sglang", "tgi", "trtllm", "triton", "llamacpp", "none",
)  # fmt: skip
"""The metric dialects an engine server can speak (``none``: it has no ``/metrics``)."""


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
        if m.dialect not in ("vllm", "vllm-old"):
            yield from _foreign(m.dialect, s, m.model_name)
            return
        labels = [m.model_name]
        families: tuple[tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, float], ...]
        families = (
            (GaugeMetricFamily, _RUNNING, "Number of requests in model execution batches.",
             s.num_running),
            (GaugeMetricFamily, _WAITING, "Number of requests waiting to be processed.",
             s.num_waiting),
            (GaugeMetricFamily, _KV if m.dialect == "vllm" else _KV_OLD,
             "KV-cache usage. 1 means 100 percent usage.", s.kv_usage),
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


_G, _C = "gauge", "counter"
_TRITON = {"model": "tensorrt_llm", "version": "1"}
_FOREIGN: dict[str, tuple[tuple[str, str, str, str, dict[str, str]], ...]] = {
    # dialect: (kind, name, help, quantity, labels); "{model}" is the served model's name
    "sglang": (
        (_G, "sglang:num_running_reqs", "The number of running requests.", "running",
         {"model_name": "{model}"}),
        (_G, "sglang:num_queue_reqs", "The number of requests in the waiting queue.",
         "waiting", {"model_name": "{model}"}),
        (_G, "sglang:token_usage", "The token usage.", "kv", {"model_name": "{model}"}),
        (_C, "sglang:prompt_tokens", "Number of prefill tokens processed.", "prompt",
         {"model_name": "{model}"}),
        (_C, "sglang:generation_tokens", "Number of generation tokens processed.",
         "generated", {"model_name": "{model}"}),
    ),
    "tgi": (
        (_G, "tgi_batch_current_size", "Current batch size", "running", {}),
        (_G, "tgi_queue_size", "Current queue size", "waiting", {}),
    ),
    "trtllm": (
        (_G, "trtllm_num_requests_running", "Number of running requests.", "running",
         {"model_name": "{model}"}),
        (_G, "trtllm_num_requests_waiting", "Number of waiting requests.", "waiting",
         {"model_name": "{model}"}),
        (_G, "trtllm_kv_cache_utilization", "KV cache utilization.", "kv",
         {"model_name": "{model}"}),
    ),
    "triton": (
        (_G, "nv_trt_llm_request_metrics", "TRT LLM request metrics", "waiting",
         {**_TRITON, "request_type": "waiting"}),
        (_G, "nv_trt_llm_request_metrics", "TRT LLM request metrics", "running",
         {**_TRITON, "request_type": "scheduled"}),
        (_G, "nv_trt_llm_request_metrics", "TRT LLM request metrics", "active",
         {**_TRITON, "request_type": "active"}),
        (_G, "nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", "kv",
         {**_TRITON, "kv_cache_block_type": "fraction"}),
    ),
    "llamacpp": (
        (_G, "llamacpp:requests_processing", "Number of requests processing.", "running", {}),
        (_G, "llamacpp:requests_deferred", "Number of requests deferred.", "waiting", {}),
        (_G, "llamacpp:kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.",
         "kv", {}),
        (_C, "llamacpp:prompt_tokens", "Number of prompt tokens processed.", "prompt", {}),
        (_C, "llamacpp:tokens_predicted", "Number of generation tokens processed.",
         "generated", {}),
    ),
    "none": (),
}  # fmt: skip
"""The series of each dialect other than vLLM's, by the quantity they report."""


def _foreign(dialect: str, s: EngineStats, model: str) -> list[Metric]:
    """The series of ``dialect`` (:data:`_FOREIGN`) with ``s``'s numbers, one family per
    name (its label sets together, as an engine exports them)."""
    values = {
        "running": float(s.num_running),
        "waiting": float(s.num_waiting),
        "active": float(s.num_running + s.num_waiting),
        "kv": float(s.kv_usage),
        "prompt": float(s.prompt_tokens_total),
        "generated": float(s.generation_tokens_total),
    }
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    for kind, name, doc, quantity, labels in _FOREIGN[dialect]:
        f = families.get(name)
        if f is None:
            cls = GaugeMetricFamily if kind == _G else CounterMetricFamily
            f = families[name] = cls(name, doc, labels=sorted(labels))
        shown = {k: v.replace("{model}", model) for k, v in labels.items()}
        f.add_metric([shown[k] for k in sorted(shown)], values[quantity])
    return list(families.values())


class EngineMetrics:
    """The metrics of one engine server: a private registry over ``stats``.

    :meth:`observe_request` records a completed request's wall-clock queue time, TTFT and
    end-to-end latency; :meth:`render` returns the Prometheus text exposition.  With
    ``load``, the requests held now and their peak are exported too.
    """

    def __init__(
        self,
        model_name: str,
        stats: EngineStats,
        dialect: str = "vllm",
        load: LoadStats | None = None,
    ) -> None:
        if dialect not in DIALECTS:
            raise ConfigError(f"unknown metrics dialect {dialect!r}: one of {', '.join(DIALECTS)}")
        self.model_name = model_name
        self.stats = stats
        self.dialect = dialect
        """The names the metrics are exported under (``none``: the server has no /metrics)."""
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
