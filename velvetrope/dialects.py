"""Engine dialects: which of an engine's Prometheus gauges mean *running*, *waiting* and *KV
usage*, as data, and the reading of a ``/metrics`` text through them.

Every engine family names its load gauges differently.  The saturation rule
(:mod:`velvetrope.core.saturation`) needs three numbers per engine: requests running,
requests waiting in the engine's own queue, and KV-cache usage as a ratio 0..1.  A
:class:`Dialect` says where to find them; :data:`DIALECTS` is the table of known engines:

* ``vllm`` (vLLM [1] [2]): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` or, from older releases, ``vllm:gpu_cache_usage_perc``;
* ``sglang`` (SGLang [2] [3]): ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:token_usage``;
* ``tgi`` (text-generation-inference [4]): ``tgi_batch_current_size``, ``tgi_queue_size``;
  no KV usage gauge;
* ``trtllm`` (TensorRT-LLM [2] [5]): trtllm-serve's ``trtllm_num_requests_running``,
  ``trtllm_num_requests_waiting``, ``trtllm_kv_cache_utilization``, or Triton's
  ``nv_trt_llm_request_metrics{request_type="scheduled"}``,
  ``nv_trt_llm_request_metrics{request_type="waiting"}``,
  ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}``;
* ``llamacpp`` (llama.cpp's server [6]): ``llamacpp:requests_processing``,
  ``llamacpp:requests_deferred``, ``llamacpp:kv_cache_usage_ratio`` (absent from recent
  builds).

Preemptions, where the engine counts them: vLLM's ``vllm:num_preemptions_total``.  Prefix
caching, where the engine counts it (re-exported by the gateway, not used by the rule):
prompt tokens looked up and found cached, vLLM's ``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total`` [1], SGLang's ``sglang:prompt_tokens_total`` and
``sglang:cached_tokens_total`` [3]; or only a hit-rate gauge, vLLM V0's
``vllm:gpu_prefix_cache_hit_rate`` and older SGLang's ``sglang:cache_hit_rate``.  Every
KV gauge above is a ratio (vLLM's "perc" gauges included: "1 means 100 percent usage");
:attr:`Gauge.scale` normalises a gauge given in percent (``engine_metrics`` with
``kv_unit: percent``).

Sources (names and label forms checked against them, not copied): [1] vLLM, "Production
Metrics" (docs.vllm.ai/en/stable/usage/metrics/; the older KV name in its V0 list);
[2] the Gateway API Inference Extension's model-server protocol
(kubernetes-sigs/gateway-api-inference-extension, docs/proposals/003-model-server-protocol:
TotalQueuedRequests, TotalRunningRequests and KVCacheUtilization for vLLM, Triton
TensorRT-LLM, trtllm-serve and SGLang); [3] SGLang, "Production Metrics"
(docs.sglang.io/references/production_metrics); [4] text-generation-inference, "Metrics"
(huggingface.co/docs/text-generation-inference/reference/metrics); [5] Triton's
TensorRT-LLM backend README, "Triton Metrics" (``nv_trt_llm_request_metrics`` with
``request_type`` waiting/context/scheduled/max/active, ``nv_trt_llm_kv_cache_block_metrics``
with ``kv_cache_block_type`` max/free/used/tokens_per/fraction); [6] llama.cpp's
``tools/server`` README, ``GET /metrics`` (served with ``--metrics``).

**Reading** (:func:`read_metrics`).  Only the lines that start with one of the dialects'
gauge names are parsed (by ``prometheus_client``'s parser, so sample timestamps, escaped
label values and ``NaN`` read as Prometheus reads them).  A sample matches a :class:`Gauge`
when its name is the gauge's and its labels include the gauge's; non-finite samples are
skipped.  Running, waiting and preemptions are summed over the matching label sets (one
engine may serve several models, or data-parallel ranks); KV usage is the largest.  Each
quantity takes the first of its candidate gauges that has a sample.

**Detection** (the rule): the dialects are tried in :data:`DIALECTS` order, and the text
speaks the first one whose *running* and *waiting* gauges both have a sample; the others it
may also match are listed in :attr:`EngineSample.also`.  A text where none matches is a
:class:`ScrapeFailure` with reason ``unknown_dialect`` (``missing_gauges`` when the dialect
was given, not detected).  A gateway pins the dialect per upstream
(``upstreams.<pool>[].engine``) or names the gauges itself (``engine_metrics``), see
:class:`velvetrope.config_sections.Upstream`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from velvetrope.core import EngineReading

__all__ = [
    "DIALECTS",
    "DIALECT_NAMES",
    "ENGINE_CHOICES",
    "Dialect",
    "EngineSample",
    "Gauge",
    "PrefixCacheSample",
    "ScrapeFailure",
    "custom_dialect",
    "parse_gauge",
    "read_metrics",
]


@dataclass(frozen=True, slots=True)
class Gauge:
    """One Prometheus series: a metric ``name``, the ``labels`` a sample must carry (others
    may be present) and the ``scale`` that turns its value into the normalised quantity
    (``0.01`` for a KV usage given in percent)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether a sample of this name with ``labels`` is this gauge's."""
        return all(labels.get(k) == v for k, v in self.labels)

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        return self.name + "{" + ",".join(f'{k}="{v}"' for k, v in self.labels) + "}"


@dataclass(frozen=True, slots=True)
class Dialect:
    """Where one engine family reports its load: candidate gauges per quantity, the first
    present wins.  Every quantity but ``running`` and ``waiting`` may be empty (the engine
    has none).  ``prefix_queries`` and ``prefix_hits`` are counters of prompt tokens looked
    up in and found in the prefix cache; ``prefix_hit_rate`` a gauge 0..1, for engines that
    report only that."""

    name: str
    engine: str
    """The engine family, for people (``"SGLang"``)."""
    running: tuple[Gauge, ...]
    waiting: tuple[Gauge, ...]
    kv_usage: tuple[Gauge, ...] = ()
    preemptions: tuple[Gauge, ...] = ()
    prefix_queries: tuple[Gauge, ...] = ()
    prefix_hits: tuple[Gauge, ...] = ()
    prefix_hit_rate: tuple[Gauge, ...] = ()

    def gauges(self) -> Iterable[Gauge]:
        """Every gauge the dialect may read."""
        yield from self.running
        yield from self.waiting
        yield from self.kv_usage
        yield from self.preemptions
        yield from self.prefix_queries
        yield from self.prefix_hits
        yield from self.prefix_hit_rate


def _g(name: str, **labels: str) -> Gauge:
    return Gauge(name, tuple(sorted(labels.items())))


_TRITON_REQ = "nv_trt_llm_request_metrics"
_TRITON_KV = "nv_trt_llm_kv_cache_block_metrics"

DIALECTS: Final[tuple[Dialect, ...]] = (
    Dialect(
        "vllm",
        "vLLM",
        (_g("vllm:num_requests_running"),),
        (_g("vllm:num_requests_waiting"),),
        (_g("vllm:kv_cache_usage_perc"), _g("vllm:gpu_cache_usage_perc")),
        (_g("vllm:num_preemptions_total"),),
        (_g("vllm:prefix_cache_queries_total"),),
        (_g("vllm:prefix_cache_hits_total"),),
        (_g("vllm:gpu_prefix_cache_hit_rate"),),
    ),
    Dialect(
        "sglang",
        "SGLang",
        (_g("sglang:num_running_reqs"),),
        (_g("sglang:num_queue_reqs"),),
        (_g("sglang:token_usage"),),
        prefix_queries=(_g("sglang:prompt_tokens_total"),),
        prefix_hits=(_g("sglang:cached_tokens_total"),),
        prefix_hit_rate=(_g("sglang:cache_hit_rate"),),
    ),
    Dialect("tgi", "TGI", (_g("tgi_batch_current_size"),), (_g("tgi_queue_size"),)),
    Dialect(
        "trtllm",
        "TensorRT-LLM",
        (_g("trtllm_num_requests_running"), _g(_TRITON_REQ, request_type="scheduled")),
        (_g("trtllm_num_requests_waiting"), _g(_TRITON_REQ, request_type="waiting")),
        (_g("trtllm_kv_cache_utilization"), _g(_TRITON_KV, kv_cache_block_type="fraction")),
    ),
    Dialect(
        "llamacpp",
        "llama.cpp",
        (_g("llamacpp:requests_processing"),),
        (_g("llamacpp:requests_deferred"),),
        (_g("llamacpp:kv_cache_usage_ratio"),),
    ),
)
"""The known engines, in detection order."""

DIALECT_NAMES: Final[tuple[str, ...]] = tuple(d.name for d in DIALECTS)
ENGINE_CHOICES: Final[tuple[str, ...]] = ("auto", "none", *DIALECT_NAMES)
"""What ``upstreams.<pool>[].engine`` may say: ``auto`` (detected), ``none`` (the engine
has no readable ``/metrics``: served without saturation) or a dialect's name."""

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SPEC = re.compile(rf"^\s*({_NAME})\s*(?:\{{(.*)\}})?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\]*)"\s*(?:,|$)')


def parse_gauge(spec: str, scale: float = 1.0) -> Gauge:
    """The :class:`Gauge` spelled ``spec``: a metric name, optionally with the labels a
    sample must carry, ``name{label="value",...}``.  Raises ``ValueError`` saying what is
    wrong (the configuration's validator reports it with the field)."""
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(
            f"{spec!r} is not a metric name (letters, digits, '_' and ':', not starting with"
            ' a digit), optionally followed by {label="value",...}'
        )
    labels: dict[str, str] = {}
    body = (m.group(2) or "").strip()
    pos = 0
    while pos < len(body):
        lm = _LABEL.match(body, pos)
        if lm is None or lm.end() == pos:
            raise ValueError(f'{spec!r}: labels must read label="value", separated by commas')
        if lm.group(1) in labels:
            raise ValueError(f"{spec!r}: label {lm.group(1)!r} is given twice")
        labels[lm.group(1)] = lm.group(2)
        pos = lm.end()
    return Gauge(m.group(1), tuple(sorted(labels.items())), scale)


def custom_dialect(
    running: str, waiting: str, kv_usage: str | None = None, kv_percent: bool = False
) -> Dialect:
    """A dialect from gauge specs (:func:`parse_gauge`) given in the configuration."""
    kv = () if kv_usage is None else (parse_gauge(kv_usage, 0.01 if kv_percent else 1.0),)
    return Dialect("custom", "custom", (parse_gauge(running),), (parse_gauge(waiting),), kv)


class ScrapeFailure(NamedTuple):
    """Why an engine gave no reading: a ``reason`` code (a label value of the gateway's
    ``velvetrope_engine_scrape_errors_total``) and a ``detail`` for people."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class PrefixCacheSample:
    """An engine's prefix cache as it reports it: prompt tokens looked up and found cached
    (cumulative counters, summed over label sets; ``None`` when not reported), and its own
    hit rate 0..1 where it gives one (a gauge; ``None`` otherwise)."""

    queries: float | None
    hits: float | None
    hit_rate: float | None


@dataclass(frozen=True, slots=True)
class EngineSample:
    """An engine's load as read through a dialect (:func:`read_metrics`)."""

    dialect: str
    running: float
    waiting: float
    kv_usage: float | None
    """0..1; ``None``: the engine reports no KV usage (the rule then reads 0)."""
    preemptions: float | None
    gauges: tuple[tuple[str, str], ...]
    """``(quantity, gauge as spelled)`` for each quantity read."""
    also: tuple[str, ...] = ()
    """Other dialects whose running and waiting gauges the text also has."""
    prefix: PrefixCacheSample | None = None
    """The engine's prefix-cache counters (``None``: it reports neither counters nor a rate)."""

    def reading(self) -> EngineReading:
        """The core's reading: running, waiting, KV usage (0 when not reported)."""
        kv = 0.0 if self.kv_usage is None else self.kv_usage
        return EngineReading(self.running, self.waiting, kv)


def _samples(
    text: str, names: frozenset[str]
) -> dict[str, list[tuple[dict[str, str], float]]] | ScrapeFailure:
    """The finite samples named in ``names``, by name; a failure if one of their lines is
    not valid exposition format."""
    # the parser costs ~10 µs a line, on the event loop: an engine's whole text (100s of
    # lines of histograms) would cost milliseconds per scrape
    prefixes = tuple(names)
    ours = [line for line in text.splitlines() if line.lstrip(" \t").startswith(prefixes)]
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families("\n".join(ours)):
            for s in family.samples:
                if s.name in names and math.isfinite(s.value):
                    out.setdefault(s.name, []).append((s.labels, s.value))
    except ValueError as e:
        return ScrapeFailure("invalid", f"a gauge's line is not Prometheus text format: {e}")
    return out


def _first(
    gauges: Sequence[Gauge], samples: dict[str, list[tuple[dict[str, str], float]]]
) -> tuple[Gauge, list[float]] | None:
    for g in gauges:
        values = [v * g.scale for labels, v in samples.get(g.name, ()) if g.matches(labels)]
        if values:
            return g, values
    return None


def read_metrics(
    text: str, dialects: Sequence[Dialect] = DIALECTS, *, detected: bool = True
) -> EngineSample | ScrapeFailure:
    """The load in the Prometheus text ``text``, read through the first of ``dialects`` it
    speaks (see the module docstring for the rule), or why it cannot be read:
    ``invalid`` (a gauge's line is not the format), ``unknown_dialect`` (``detected``: none
    of ``dialects`` matches) or ``missing_gauges`` (not ``detected``: the given dialect's
    running or waiting gauge has no sample)."""
    names = frozenset(g.name for d in dialects for g in d.gauges())
    samples = _samples(text, names)
    if isinstance(samples, ScrapeFailure):
        return samples
    found: list[tuple[Dialect, tuple[Gauge, list[float]], tuple[Gauge, list[float]]]] = []
    for d in dialects:
        running = _first(d.running, samples)
        waiting = _first(d.waiting, samples)
        if running is not None and waiting is not None:
            found.append((d, running, waiting))
    if not found:
        if detected:
            known = ", ".join(f"{d.engine} ({d.name})" for d in dialects)
            return ScrapeFailure(
                "unknown_dialect", f"no running and waiting gauges of a known engine: {known}"
            )
        d = dialects[0]
        want = " and ".join(str(g[0]) for g in (d.running, d.waiting))
        return ScrapeFailure("missing_gauges", f"no sample of {want} ({d.name})")
    d, (rg, rv), (wg, wv) = found[0]
    gauges = [("running", str(rg)), ("waiting", str(wg))]
    kv = _first(d.kv_usage, samples)
    if kv is not None:
        gauges.append(("kv_usage", str(kv[0])))
    pre = _first(d.preemptions, samples)
    return EngineSample(
        d.name,
        sum(rv),
        sum(wv),
        None if kv is None else max(kv[1]),
        None if pre is None else sum(pre[1]),
        tuple(gauges),
        tuple(x[0].name for x in found[1:]),
        _prefix(d, samples),
    )


def _prefix(
    d: Dialect, samples: dict[str, list[tuple[dict[str, str], float]]]
) -> PrefixCacheSample | None:
    """``d``'s prefix-cache counters in ``samples`` (sums; the rate: the largest)."""
    q, h, r = (_first(g, samples) for g in (d.prefix_queries, d.prefix_hits, d.prefix_hit_rate))
    if q is None and h is None and r is None:
        return None
    return PrefixCacheSample(
        None if q is None else sum(q[1]),
        None if h is None else sum(h[1]),
        None if r is None else max(r[1]),
    )
