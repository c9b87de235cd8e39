"""Engine dialects (velvetrope.dialects): detection and reading per engine family, from
/metrics texts shaped like each engine's own (HELP and TYPE lines, labels, histograms and
counters around the gauges), and the gauge specs a configuration may give."""

from __future__ import annotations

import pytest

from velvetrope.core import EngineReading
from velvetrope.dialects import (
    DIALECT_NAMES,
    DIALECTS,
    EngineSample,
    PrefixCacheSample,
    ScrapeFailure,
    custom_dialect,
    parse_gauge,
    read_metrics,
)
from velvetrope.gateway.upstream.scrape import PrefixTally

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.61
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 9.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 9.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 20.5
"""

VLLM_OLD = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama-2-7b"} 7.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="llama-2-7b"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama-2-7b"} 2.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama-2-7b"} 0.83
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="llama-2-7b"} 0.0
"""

SGLANG = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="Qwen/Qwen2.5-7B-Instruct"} 812890.0
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-7B-Instruct"} 31.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{model_name="Qwen/Qwen2.5-7B-Instruct"} 52011.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.28
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen2.5-7B-Instruct"} 6.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0075
"""

TGI = """\
# TYPE tgi_request_count counter
tgi_request_count 150
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 5
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 9100
# TYPE tgi_batch_next_size histogram
tgi_batch_next_size_bucket{le="1"} 4
tgi_batch_next_size_bucket{le="+Inf"} 40
tgi_batch_next_size_sum 120
tgi_batch_next_size_count 40
"""

TRTLLM_SERVE = """\
# HELP trtllm_num_requests_running Number of requests running.
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="llama-8b",engine_type="trtllm"} 9.0
# HELP trtllm_num_requests_waiting Number of requests waiting.
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="llama-8b",engine_type="trtllm"} 1.0
# HELP trtllm_kv_cache_utilization KV cache utilization.
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model_name="llama-8b",engine_type="trtllm"} 0.62
"""

TRITON = """\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 500
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 4
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 7
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 3000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 1800
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.6
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
"""  # noqa: E501

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33065
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 7801
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.4
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

LLAMACPP_NO_KV = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n"


def sample(text: str) -> EngineSample:
    got = read_metrics(text)
    assert isinstance(got, EngineSample), got
    return got


@pytest.mark.parametrize(
    ("text", "dialect", "reading", "kv_gauge"),
    [
        (VLLM, "vllm", EngineReading(12, 4, 0.61), "vllm:kv_cache_usage_perc"),
        (VLLM_OLD, "vllm", EngineReading(7, 2, 0.83), "vllm:gpu_cache_usage_perc"),
        (SGLANG, "sglang", EngineReading(31, 6, 0.28), "sglang:token_usage"),
        (TGI, "tgi", EngineReading(5, 3, 0.0), None),
        (TRTLLM_SERVE, "trtllm", EngineReading(9, 1, 0.62), "trtllm_kv_cache_utilization"),
        (
            TRITON,
            "trtllm",
            EngineReading(4, 3, 0.6),
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}',
        ),
        (LLAMACPP, "llamacpp", EngineReading(4, 2, 0.4), "llamacpp:kv_cache_usage_ratio"),
        (LLAMACPP_NO_KV, "llamacpp", EngineReading(1, 0, 0.0), None),
    ],
)
def test_each_engine_is_detected_and_read(
    text: str, dialect: str, reading: EngineReading, kv_gauge: str | None
) -> None:
    s = sample(text)
    assert (s.dialect, s.reading(), s.also) == (dialect, reading, ())
    assert dict(s.gauges).get("kv_usage") == kv_gauge
    assert (s.kv_usage is None) == (kv_gauge is None)  # no KV gauge: said, not a fake 0


def test_preemptions_are_read_where_the_engine_counts_them() -> None:
    assert sample(VLLM).preemptions == 3.0
    assert sample(SGLANG).preemptions is None


def test_tritons_request_types_are_told_apart_by_label() -> None:
    s = sample(TRITON)
    # running is the scheduled count, not active (7), max (512) or their sum
    assert dict(s.gauges) == {
        "running": 'nv_trt_llm_request_metrics{request_type="scheduled"}',
        "waiting": 'nv_trt_llm_request_metrics{request_type="waiting"}',
        "kv_usage": 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}',
    }
    older = "\n".join(line for line in TRITON.splitlines() if 'type="waiting"' not in line)
    assert read_metrics(older) == ScrapeFailure(
        "unknown_dialect",
        "no running and waiting gauges of a known engine: vLLM (vllm), SGLang (sglang), "
        "TGI (tgi), TensorRT-LLM (trtllm), llama.cpp (llamacpp)",
    )


def test_the_current_vllm_kv_name_wins_over_the_older_one() -> None:
    both = VLLM + 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99\n'
    assert sample(both).kv_usage == 0.61


def test_detection_takes_the_first_dialect_in_table_order_and_names_the_others() -> None:
    s = sample(SGLANG + VLLM)  # e.g. a proxy that re-exports two engines
    assert (s.dialect, s.also) == ("vllm", ("sglang",))
    assert [d.name for d in DIALECTS] == list(DIALECT_NAMES)


def test_a_text_of_no_known_engine_is_unreadable_with_its_reason() -> None:
    got = read_metrics("process_cpu_seconds_total 1.5\nhttp_requests_total 9\n")
    assert isinstance(got, ScrapeFailure) and got.reason == "unknown_dialect"
    only_running = read_metrics("vllm:num_requests_running 3\n")  # half a dialect
    assert isinstance(only_running, ScrapeFailure) and only_running.reason == "unknown_dialect"


def test_a_pinned_dialect_reads_only_its_own_gauges() -> None:
    sglang = next(d for d in DIALECTS if d.name == "sglang")
    got = read_metrics(VLLM, [sglang], detected=False)
    assert got == ScrapeFailure(
        "missing_gauges", "no sample of sglang:num_running_reqs and sglang:num_queue_reqs (sglang)"
    )
    assert isinstance(read_metrics(SGLANG, [sglang], detected=False), EngineSample)


# -- the reading's robustness (the scraper's contract since vLLM-only days) -------------------


def test_label_sets_are_summed_and_kv_is_the_largest() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_waiting{model_name="a"} 3.0',
            'vllm:num_requests_waiting{model_name="b"} 2.0',
            'vllm:num_requests_running{model_name="a"} 7.0',
            'vllm:kv_cache_usage_perc{model_name="a"} 0.5',
            'vllm:kv_cache_usage_perc{model_name="b"} 0.25',
            "process_cpu_seconds_total 1.5",
        ]
    )
    assert sample(text).reading() == EngineReading(running=7.0, waiting=5.0, kv_usage=0.5)


def test_a_sample_timestamp_is_not_its_value() -> None:
    text = "\n".join(
        [
            "sglang:num_queue_reqs 3 1700000000000",
            'sglang:num_running_reqs{model_name="a"} 7 1700000000000',
            "sglang:token_usage 0.5 1700000000000",
        ]
    )
    assert sample(text).reading() == EngineReading(running=7.0, waiting=3.0, kv_usage=0.5)


def test_escaped_label_values_are_read_whole() -> None:
    # a quote, a backslash, a newline, a brace and a space-and-number inside label values
    text = "\n".join(
        [
            'vllm:num_requests_waiting{model_name="say \\"hi\\" 9"} 2',
            'vllm:num_requests_waiting{model_name="C:\\\\models\\n} 8"} 4',
            'vllm:num_requests_running{model_name="a,b=\\"c\\""} 1',
            "vllm:kv_cache_usage_perc 0.25",
        ]
    )
    assert sample(text).reading() == EngineReading(running=1.0, waiting=6.0, kv_usage=0.25)


def test_nan_and_infinite_samples_are_skipped() -> None:
    text = "\n".join(
        [
            'tgi_queue_size{x="a"} NaN',
            'tgi_queue_size{x="b"} 2',
            'tgi_batch_current_size{x="a"} +Inf',
            'tgi_batch_current_size{x="b"} 5',
        ]
    )
    assert sample(text).reading() == EngineReading(running=5.0, waiting=2.0, kv_usage=0.0)
    got = read_metrics("vllm:num_requests_waiting NaN\nvllm:num_requests_running -Inf\n")
    assert isinstance(got, ScrapeFailure) and got.reason == "unknown_dialect"


def test_only_the_gauges_lines_are_read() -> None:
    good = "vllm:num_requests_waiting 3\n  vllm:num_requests_running\t1\n"  # blanks allowed
    reading = EngineReading(running=1.0, waiting=3.0, kv_usage=0.0)
    assert sample(good).reading() == reading
    # another exporter's line that is not the format does not blind the gateway ...
    assert sample(good + 'other_metric{label="unclosed} 1\n').reading() == reading
    # ... a longer name that starts like a gauge's is another metric ...
    assert sample(good + "vllm:num_requests_waiting_by_reason 40\n").reading() == reading
    # ... and a gauge's line that is not the format makes the text unreadable
    got = read_metrics(good + 'vllm:kv_cache_usage_perc{model_name="a} 0.5\n')
    assert isinstance(got, ScrapeFailure) and got.reason == "invalid"


# -- gauges named in a configuration ----------------------------------------------------------


def test_gauge_specs_parse_with_labels() -> None:
    g = parse_gauge(' my_engine:queue{ model = "llama", shard="0" } ')
    assert (g.name, g.labels, str(g)) == (
        "my_engine:queue",
        (("model", "llama"), ("shard", "0")),
        'my_engine:queue{model="llama",shard="0"}',
    )
    assert g.matches({"model": "llama", "shard": "0", "extra": "x"})
    assert not g.matches({"model": "llama"})


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("9lives", "is not a metric name"),
        ("queue depth", "is not a metric name"),
        ('queue{model="a"', "is not a metric name"),
        ("queue{model=a}", 'label="value"'),
        ('queue{model="a" shard="b"}', 'label="value"'),
        ('queue{model="a",model="b"}', "given twice"),
    ],
)
def test_bad_gauge_specs_say_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_gauge(spec)


def test_a_custom_dialect_reads_percent_kv_as_a_ratio() -> None:
    text = 'eng_running{m="a"} 3\neng_running{m="b"} 1\neng_waiting 2\neng_kv_pct 85\n'
    d = custom_dialect('eng_running{m="a"}', "eng_waiting", "eng_kv_pct", kv_percent=True)
    got = read_metrics(text, [d], detected=False)
    assert isinstance(got, EngineSample)
    assert (got.dialect, got.reading()) == ("custom", EngineReading(3.0, 2.0, 0.85))


def test_prefix_cache_counters_are_read_where_the_engine_reports_them() -> None:
    text = VLLM + (
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0\n'
        'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0\n'
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100.0\n'
    )
    assert sample(text).prefix == PrefixCacheSample(1500.0, 700.0, None)
    assert sample(VLLM).prefix is None  # not reported: nothing claimed
    old = VLLM_OLD + 'vllm:gpu_prefix_cache_hit_rate{model_name="llama-2-7b"} 0.42\n'
    assert sample(old).prefix == PrefixCacheSample(None, None, 0.42)
    sg = SGLANG + (
        'sglang:cached_tokens_total{model_name="q",cache_source="device"} 300.0\n'
        'sglang:cached_tokens_total{model_name="q",cache_source="host"} 50.0\n'
    )
    assert sample(sg).prefix == PrefixCacheSample(812890.0, 350.0, 0.0075)


def test_the_gateways_tally_counts_increments_and_survives_an_engine_restart() -> None:
    tally = PrefixTally()
    tally.add(PrefixCacheSample(100.0, 40.0, None))  # the first reading is the baseline
    assert (tally.queries, tally.hits) == (0.0, 0.0)
    tally.add(PrefixCacheSample(300.0, 140.0, None))
    assert (tally.queries, tally.hits) == (200.0, 100.0)
    tally.add(PrefixCacheSample(50.0, 10.0, None))  # restarted: counts from zero again
    assert (tally.queries, tally.hits) == (250.0, 110.0)
    tally.add(PrefixCacheSample(None, None, 0.5))  # only a rate: no baseline
    tally.add(PrefixCacheSample(80.0, 20.0, None))  # a new baseline, nothing counted
    assert (tally.queries, tally.hits) == (250.0, 110.0)
