"""Sizing with speculative decoding and prefix caching: the profile, the curve, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.engine import EngineProfile
from velvetrope.engine.speculative import (
    acceptance_for_tokens_per_step,
    expected_tokens_per_step,
    mean_steps,
    steps_pmf,
)
from velvetrope.errors import PolicyError
from velvetrope.planner.engine_options import (
    DEFAULT_ACCEPTANCE,
    describe,
    prefix_caching_profile,
    with_speculation,
)
from velvetrope.planner.length_mix import LengthMix
from velvetrope.planner.service_methods import analytic_service_curve, measure_service_curve

SMALL = EngineProfile(
    name="small",
    description="test",
    step_base_s=0.01,
    per_prefill_token_s=5e-5,
    per_decode_seq_s=1e-4,
    per_context_token_s=1e-8,
    block_size=16,
    num_gpu_blocks=4000,
    max_num_seqs=16,
    max_num_batched_tokens=2048,
    max_model_len=4096,
)
RNG = np.random.default_rng(5)
PROMPT = np.rint(RNG.lognormal(np.log(1500), 0.3, 200)).astype(np.int64)
OUTPUT = np.rint(RNG.lognormal(np.log(120), 0.5, 200)).astype(np.int64) + 1


def _curve(profile: EngineProfile, hit: float = 0.0) -> float:
    c = measure_service_curve(profile, PROMPT, OUTPUT, grid=(4, 16), prefix_hit_rate=hit)
    return c.throughput(16)


def test_speculation_that_is_accepted_raises_the_service_rate() -> None:
    plain = _curve(SMALL)
    good = _curve(with_speculation(SMALL, 3, 0.8, draft_ms=0.5))
    useless = _curve(with_speculation(SMALL, 3, 0.0, draft_ms=0.5))
    assert good > 1.3 * plain  # ~2.95 tokens per step for some extra cost per step
    assert useless < plain  # drafts that are never accepted only cost time


def test_a_shared_prompt_prefix_raises_the_service_rate() -> None:
    plain = _curve(prefix_caching_profile(SMALL, 0.8), 0.0)
    cached = _curve(prefix_caching_profile(SMALL, 0.8), 0.8)
    assert cached > 1.1 * plain
    assert prefix_caching_profile(SMALL, 0.0) == SMALL


def test_options_are_validated_and_described() -> None:
    assert with_speculation(SMALL, 0, 0.5) is SMALL
    p = with_speculation(SMALL, 4, 0.7, 1.0)
    assert (p.spec_tokens, p.spec_acceptance, p.spec_draft_step_s) == (4, 0.7, 0.001)
    text = describe(p, 0.25)
    assert text is not None and "2.77 tokens per verification step" in text and "25%" in text
    assert describe(SMALL, 0.0) is None
    with pytest.raises(PolicyError, match="spec-tokens"):
        with_speculation(SMALL, 17, 0.5)
    with pytest.raises(PolicyError, match="spec-acceptance"):
        with_speculation(SMALL, 2, 1.5)
    with pytest.raises(PolicyError, match="prefix-hit-rate"):
        prefix_caching_profile(SMALL, 1.0)


def test_plan_sizes_with_speculation(tmp_path: Path) -> None:
    w = tmp_path / "w.yaml"
    w.write_text(
        "prompt_tokens: {p50: 600, p99: 3000}\noutput_tokens: {p50: 100, p99: 500}\n"
        "arrival_rate_p99_1m: 30\n"
    )
    base = ["plan", "--workload", str(w), "--json"]
    plain = json.loads(CliRunner().invoke(app, base).output)
    res = CliRunner().invoke(app, [*base, "--spec-tokens", "4", "--spec-acceptance", "0.8"])
    assert res.exit_code == 0, res.output
    spec = json.loads(res.output)
    assert "speculative decoding k=4" in spec["engine_features"]
    # at a large batch verifying drafts costs compute, so the gain is well below 3x
    assert spec["service"]["max_throughput_rps"] > 1.1 * plain["service"]["max_throughput_rps"]
    assert spec["plan"]["replicas"] <= plain["plan"]["replicas"]


def test_length_mix_serves_whole_blocks_of_the_shared_prefix() -> None:
    on = SMALL.with_overrides(enable_prefix_caching=True, max_num_batched_tokens=64)
    m = LengthMix.fit([100, 17, 16, 200], [5, 5, 5, 5], on, prefix_hit_rate=0.5)
    assert m.prefix.tolist() == [50, 8, 8, 100]
    assert m.cached.tolist() == [48, 0, 0, 96]  # whole 16-token blocks of the prefix
    assert m.first.tolist() == [1, 1, 1, 2]  # ceil((P - cached) / 64)
    assert m.prompt_values.tolist() == [16, 17, 52, 104]  # the tokens still prefilled
    high = LengthMix.fit([17, 32], [2, 2], on, prefix_hit_rate=0.99)
    assert high.cached.tolist() == [16, 16]  # the last prompt token is always computed
    off = LengthMix.fit([100], [5], SMALL, prefix_hit_rate=0.5)  # caching off: no hits
    assert off.cached.tolist() == [0] and off.prefix.tolist() == [50]
    with pytest.raises(PolicyError, match="prefix hit rate"):
        LengthMix.fit([100], [5], on, prefix_hit_rate=1.0)


def test_length_mix_counts_verification_steps() -> None:
    k, a = 3, 0.6
    m = LengthMix.fit([100, 100], [1, 31], with_speculation(SMALL, k, a))
    assert m.steps.tolist() == pytest.approx([0.0, mean_steps(30, k, a)])
    assert m.work.tolist() == pytest.approx([1.0, 1.0 + mean_steps(30, k, a)])
    pmf = steps_pmf(30, k, a)
    var = sum(s * s * p for s, p in enumerate(pmf)) - mean_steps(30, k, a) ** 2
    assert float(m.steps_var[1]) == pytest.approx(var)
    w = m.work
    assert m.work_scv == pytest.approx((w.var() + var / 2) / w.mean() ** 2)


@pytest.mark.parametrize(
    ("label", "profile", "hit"),
    [
        ("plain", SMALL, 0.0),
        ("prefix", prefix_caching_profile(SMALL, 0.6), 0.6),
        ("speculation", with_speculation(SMALL, 3, 0.75, draft_ms=0.5), 0.0),
        ("both", prefix_caching_profile(with_speculation(SMALL, 3, 0.75, 0.5), 0.6), 0.6),
    ],
)
def test_analytic_and_closed_loop_agree_with_each_feature(
    label: str, profile: EngineProfile, hit: float
) -> None:
    m = measure_service_curve(profile, PROMPT, OUTPUT, grid=(1, 4, 16), prefix_hit_rate=hit)
    a = analytic_service_curve(profile, PROMPT, OUTPUT, grid=(1, 4, 16), prefix_hit_rate=hit)
    rel = np.abs(m.raw_throughput_rps / a.raw_throughput_rps - 1.0)
    assert float(rel.max()) < 0.02, (label, rel)


def test_analytic_model_gains_from_each_feature() -> None:
    plain = analytic_service_curve(SMALL, PROMPT, OUTPUT).max_throughput_rps
    pc = prefix_caching_profile(SMALL, 0.6)
    cached = analytic_service_curve(pc, PROMPT, OUTPUT, prefix_hit_rate=0.6).max_throughput_rps
    spec = with_speculation(SMALL, 3, 0.8, draft_ms=0.5)
    fast = analytic_service_curve(spec, PROMPT, OUTPUT).max_throughput_rps
    useless = with_speculation(SMALL, 3, 0.0, draft_ms=0.5)
    slow = analytic_service_curve(useless, PROMPT, OUTPUT).max_throughput_rps
    assert cached > 1.1 * plain
    assert fast > 1.3 * plain
    assert slow < plain


def test_accepted_tokens_per_step_stands_for_the_acceptance_rate() -> None:
    p = with_speculation(SMALL, 4, None, accepted_per_step=2.3)
    assert p.spec_acceptance == acceptance_for_tokens_per_step(4, 2.3)
    assert expected_tokens_per_step(4, p.spec_acceptance) == pytest.approx(2.3)
    assert with_speculation(SMALL, 4).spec_acceptance == DEFAULT_ACCEPTANCE
    with pytest.raises(PolicyError, match="mutually exclusive"):
        with_speculation(SMALL, 4, 0.5, accepted_per_step=2.0)
    with pytest.raises(PolicyError, match=r"--spec-accepted-per-step must be in \[1, 5\]"):
        with_speculation(SMALL, 4, accepted_per_step=5.5)
    with pytest.raises(PolicyError, match="needs --spec-tokens"):
        with_speculation(SMALL, 0, accepted_per_step=1.5)
