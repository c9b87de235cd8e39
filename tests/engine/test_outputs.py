"""Output-length policy: deterministic per prompt, Azure-like by default, capped, ignore_eos."""

from __future__ import annotations

import statistics

import pytest

from velvetrope.engine.outputs import (
    DEFAULT_LENGTHS,
    FixedLengths,
    LogNormalLengths,
    OutputPolicy,
    UniformLengths,
    parse_lengths,
    unit_from_key,
)
from velvetrope.errors import ConfigError


def test_same_prompt_same_length_different_prompts_vary() -> None:
    policy = OutputPolicy()
    a = policy.decide("tell me a story", 4096)
    assert policy.decide("tell me a story", 4096) == a
    assert policy.decide(b"tell me a story", 4096) == a
    lengths = {policy.decide(f"prompt {i}", 4096).tokens for i in range(50)}
    assert len(lengths) > 20


def test_seed_changes_the_draw_reproducibly() -> None:
    keys = [f"prompt {i}" for i in range(50)]
    base = [OutputPolicy(seed=0).decide(k, 4096).tokens for k in keys]
    other = [OutputPolicy(seed=7).decide(k, 4096).tokens for k in keys]
    assert other != base
    assert other == [OutputPolicy(seed=7).decide(k, 4096).tokens for k in keys]


def test_default_is_close_to_the_azure_conversation_trace() -> None:
    policy = OutputPolicy()
    draws = sorted(policy.decide(f"request number {i}", 100_000).tokens for i in range(20_000))
    median = statistics.median(draws)
    p99 = draws[int(0.99 * len(draws))]
    assert 120 <= median <= 140  # the trace: 129
    assert 540 <= p99 <= 660  # the trace: 601
    assert min(draws) >= 1


def test_max_tokens_caps_the_draw_with_finish_reason_length() -> None:
    policy = OutputPolicy(FixedLengths(100))
    assert policy.decide("x", 500).tokens == 100
    assert policy.decide("x", 500).finish_reason == "stop"
    capped = policy.decide("x", 40)
    assert (capped.tokens, capped.finish_reason) == (40, "length")
    exact = policy.decide("x", 100)
    assert (exact.tokens, exact.finish_reason) == (100, "length")


def test_ignore_eos_gives_exactly_max_tokens() -> None:
    policy = OutputPolicy(FixedLengths(3))
    for cap in (1, 17, 3000):
        d = policy.decide("x", cap, ignore_eos=True)
        assert (d.tokens, d.finish_reason) == (cap, "length")


def test_max_tokens_below_one_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        OutputPolicy().decide("x", 0)


def test_unit_from_key_is_in_the_open_unit_interval_and_stable() -> None:
    us = [unit_from_key(f"k{i}") for i in range(1000)]
    assert all(0.0 < u < 1.0 for u in us)
    assert unit_from_key("k1") == us[1]
    assert unit_from_key("k1", seed=1) != us[1]
    assert 0.45 < statistics.mean(us) < 0.55


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("lognormal", DEFAULT_LENGTHS),
        ("lognormal:median=200,p99=1500", LogNormalLengths(200, 1500)),
        ("lognormal:median=50,p99=100,min=10,max=120", LogNormalLengths(50, 100, 10, 120)),
        ("fixed:128", FixedLengths(128)),
        ("uniform:16:512", UniformLengths(16, 512)),
    ],
)
def test_parse_lengths_round_trips(spec: str, expected: object) -> None:
    parsed = parse_lengths(spec)
    assert parsed == expected
    assert parse_lengths(parsed.spec) == parsed


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "normal:10",
        "fixed:",
        "fixed:0",
        "fixed:ten",
        "uniform:5",
        "uniform:9:3",
        "lognormal:median=600,p99=100",
        "lognormal:mean=3",
        "lognormal:median",
        "lognormal:median=x",
        "lognormal:median=inf,p99=inf",
    ],
)
def test_bad_specs_are_config_errors(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_lengths(spec)


def test_distributions_respect_their_bounds() -> None:
    clamped = LogNormalLengths(100, 1000, minimum=50, maximum=150)
    assert clamped.quantile(1e-9) == 50
    assert clamped.quantile(1 - 1e-9) == 150
    uniform = UniformLengths(3, 5)
    assert {uniform.quantile(u / 100) for u in range(1, 100)} == {3, 4, 5}
    assert uniform.quantile(0.999999) == 5
