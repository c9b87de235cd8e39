"""The engine server's /metrics in other engines' dialects (``--metrics-dialect``): the same
numbers under each engine family's names, and nothing of vLLM's; the gateway's reader
(velvetrope.dialects, spelled apart from this renderer) reads them back."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.dialects import EngineSample, read_metrics
from velvetrope.engine.serve.metrics import DIALECTS, EngineMetrics
from velvetrope.errors import ConfigError


@dataclass
class Stats:
    num_running: int = 3
    num_waiting: int = 5
    kv_usage: float = 0.25
    num_preemptions: int = 1
    prompt_tokens_total: int = 700
    generation_tokens_total: int = 900


def samples(dialect: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = EngineMetrics("m", Stats(), dialect).render().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        (
            "vllm-old",
            {
                "vllm:num_requests_running": 3,
                "vllm:num_requests_waiting": 5,
                "vllm:gpu_cache_usage_perc": 0.25,
            },
        ),
        (
            "sglang",
            {
                "sglang:num_running_reqs": 3,
                "sglang:num_queue_reqs": 5,
                "sglang:token_usage": 0.25,
                "sglang:prompt_tokens_total": 700,
                "sglang:generation_tokens_total": 900,
            },
        ),
        ("tgi", {"tgi_batch_current_size": 3, "tgi_queue_size": 5}),
        (
            "trtllm",
            {
                "trtllm_num_requests_running": 3,
                "trtllm_num_requests_waiting": 5,
                "trtllm_kv_cache_utilization": 0.25,
            },
        ),
        (
            "llamacpp",
            {
                "llamacpp:requests_processing": 3,
                "llamacpp:requests_deferred": 5,
                "llamacpp:kv_cache_usage_ratio": 0.25,
                "llamacpp:prompt_tokens_total": 700,
                "llamacpp:tokens_predicted_total": 900,
            },
        ),
    ],
)
def test_each_dialect_speaks_only_its_own_names(dialect: str, expected: dict[str, float]) -> None:
    got = samples(dialect)
    assert {name: [v for _, v in vs] for name, vs in got.items() if name in expected} == {
        name: [v] for name, v in expected.items()
    }
    if dialect != "vllm-old":
        assert not any(name.startswith("vllm:") for name in got)
    else:
        assert (
            "vllm:kv_cache_usage_perc" not in got
            and "vllm:e2e_request_latency_seconds_count" in got
        )


def test_triton_reports_by_request_and_block_type() -> None:
    got = samples("triton")
    requests = {labels["request_type"]: v for labels, v in got["nv_trt_llm_request_metrics"]}
    assert requests == {"waiting": 5, "scheduled": 3, "active": 8}
    assert got["nv_trt_llm_kv_cache_block_metrics"] == [
        ({"kv_cache_block_type": "fraction", "model": "tensorrt_llm", "version": "1"}, 0.25)
    ]
    assert set(got) == {"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"}


@pytest.mark.parametrize("dialect", [d for d in DIALECTS if d != "none"])
def test_the_gateway_reads_every_dialect_back(dialect: str) -> None:
    text = EngineMetrics("m", Stats(), dialect).render().decode()
    got = read_metrics(text)
    assert isinstance(got, EngineSample), got
    kv = 0.0 if dialect == "tgi" else 0.25
    assert (got.running, got.waiting, got.reading().kv_usage) == (3, 5, kv)


def test_an_unknown_dialect_is_refused_and_none_exports_nothing() -> None:
    with pytest.raises(ConfigError, match="unknown metrics dialect 'vllm2'"):
        EngineMetrics("m", Stats(), "vllm2")
    assert samples("none") == {}


def test_the_command_line_refuses_an_unknown_dialect() -> None:
    result = CliRunner().invoke(app, ["engine", "--metrics-dialect", "sglang2"])
    said = " ".join(result.output.replace("│", " ").split())  # rich's box, unwrapped
    assert result.exit_code == 2
    assert "must be one of vllm, vllm-old, sglang, tgi, trtllm, triton, llamacpp, none" in said
