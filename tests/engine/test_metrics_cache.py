"""The prefix-cache and speculative-decoding counters of the engine's /metrics."""

from __future__ import annotations

from dataclasses import dataclass

from velvetrope.engine import Batcher, EngineProfile
from velvetrope.engine.serve.metrics import CACHE_METRIC_NAMES, CacheStats, EngineMetrics


@dataclass
class _Base:
    num_running: int = 1
    num_waiting: int = 0
    kv_usage: float = 0.5
    num_preemptions: int = 0
    prompt_tokens_total: int = 10
    generation_tokens_total: int = 3


@dataclass
class _WithCache(_Base):
    prefix_cache_queries: int = 640
    prefix_cache_hits: int = 512
    spec_draft_tokens: int = 30
    spec_accepted_tokens: int = 21


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{", 1)[0]] = float(value)
    return out


def test_cache_counters_are_exported_under_vllms_names() -> None:
    got = _samples(EngineMetrics("m", _WithCache()).render().decode())
    assert got["vllm:prefix_cache_queries_total"] == 640
    assert got["vllm:prefix_cache_hits_total"] == 512
    assert got["vllm:spec_decode_num_draft_tokens_total"] == 30
    assert got["vllm:spec_decode_num_accepted_tokens_total"] == 21
    assert set(CACHE_METRIC_NAMES) <= set(got)


def test_a_source_without_caches_exports_none_of_them() -> None:
    got = _samples(EngineMetrics("m", _Base()).render().decode())
    assert not set(CACHE_METRIC_NAMES) & set(got)


def test_the_batcher_counts_what_vllm_counts() -> None:
    prof = EngineProfile(
        name="t", description="t", step_base_s=0.01, per_prefill_token_s=0.001,
        per_decode_seq_s=0.002, per_context_token_s=0.0, block_size=4, num_gpu_blocks=64,
        max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128,
        enable_prefix_caching=True, spec_tokens=2, spec_acceptance=1.0,
    )  # fmt: skip
    b = Batcher(prof)
    assert isinstance(b, CacheStats)
    b.add("a", 12, 7, 0.0, prefix_id="p", prefix_tokens=8)
    t = 0.0
    while b.has_work:
        t = b.step(t).end
    b.add("b", 12, 1, t, prefix_id="p", prefix_tokens=8)
    b.step(t)
    assert (b.prefix_cache_queries, b.prefix_cache_hits) == (24, 8)
    assert (b.spec_draft_tokens, b.spec_accepted_tokens) == (4, 4)  # 6 tokens: 3 + 3
