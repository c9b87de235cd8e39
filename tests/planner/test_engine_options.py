"""Sizing with speculative decoding and prefix caching: the profile, the curve, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.engine import EngineProfile
from velvetrope.errors import PolicyError
from velvetrope.planner.engine_options import describe, prefix_caching_profile, with_speculation
from velvetrope.planner.service import measure_service_curve

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


def test_plan_refuses_features_the_analytic_model_lacks(tmp_path: Path) -> None:
    w = tmp_path / "w.yaml"
    w.write_text(
        "prompt_tokens: {p50: 600, p99: 3000}\noutput_tokens: {p50: 100, p99: 500}\n"
        "arrival_rate_p99_1m: 30\n"
    )
    args = ["plan", "--workload", str(w), "--service-model", "analytic", "--spec-tokens", "2"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "closed-loop" in res.output
