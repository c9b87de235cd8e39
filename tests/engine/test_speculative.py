"""Speculative decoding: the per-step distribution, steps per reply, and the batcher's steps."""

from __future__ import annotations

import math

import pytest

from velvetrope.engine import Batcher, EngineProfile, Finished, FirstToken, Tokens
from velvetrope.engine.speculative import (
    acceptance_for_tokens_per_step,
    decode_time_pmf,
    expected_tokens_per_step,
    mean_steps,
    steps_moments,
    steps_pmf,
    tokens_per_step_pmf,
)
from velvetrope.errors import PolicyError


def _profile(**kw: float | int | bool) -> EngineProfile:
    base = EngineProfile(
        name="spec",
        description="test",
        step_base_s=0.01,
        per_prefill_token_s=0.001,
        per_decode_seq_s=0.002,
        per_context_token_s=0.0,
        block_size=4,
        num_gpu_blocks=256,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=512,
    )
    return base.with_overrides(**kw)


# -- the distribution ----------------------------------------------------------------------


def test_tokens_per_step_pmf_small_exact_case() -> None:
    assert tokens_per_step_pmf(2, 0.5) == [0.5, 0.25, 0.25]
    assert tokens_per_step_pmf(0, 0.7) == [1.0]
    assert tokens_per_step_pmf(3, 0.0) == [1.0, 0.0, 0.0, 0.0]
    assert tokens_per_step_pmf(3, 1.0) == [0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize(("k", "alpha"), [(1, 0.3), (3, 0.5), (4, 0.8), (5, 0.0), (2, 1.0)])
def test_expected_tokens_is_the_closed_form_and_the_pmf_mean(k: int, alpha: float) -> None:
    pmf = tokens_per_step_pmf(k, alpha)
    assert math.fsum(pmf) == pytest.approx(1.0)
    mean = math.fsum(m * p for m, p in enumerate(pmf, start=1))
    assert expected_tokens_per_step(k, alpha) == pytest.approx(mean)
    closed = k + 1 if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    assert expected_tokens_per_step(k, alpha) == pytest.approx(closed)


def test_expected_tokens_of_the_textbook_case() -> None:
    assert expected_tokens_per_step(3, 0.5) == pytest.approx(1.875)


def test_steps_pmf_small_exact_case() -> None:
    # 3 tokens, k=2, alpha=0.5: a step emits 1 (p=.5), 2 (.25) or 3 (.25) tokens.
    # 1 step: first emits >= 3: .25.  2 steps: (1 then >=2: .5*.5) + (2 then >=1: .25) = .5.
    # 3 steps: 1, 1, then anything: .25.
    assert steps_pmf(3, 2, 0.5) == pytest.approx([0.0, 0.25, 0.5, 0.25])
    assert mean_steps(3, 2, 0.5) == pytest.approx(2.0)


def test_steps_pmf_edges() -> None:
    assert steps_pmf(0, 3, 0.5) == [1.0]
    assert steps_pmf(5, 0, 0.9) == pytest.approx([0, 0, 0, 0, 0, 1.0])
    assert steps_pmf(7, 3, 1.0) == pytest.approx([0, 0, 1.0, 0, 0, 0, 0, 0])  # 4 + 3
    assert math.fsum(steps_pmf(40, 4, 0.7)) == pytest.approx(1.0)


def test_decode_time_pmf_scales_the_step_distribution() -> None:
    got = decode_time_pmf(3, 2, 0.5, 0.01)
    assert [t for t, _ in got] == pytest.approx([0.01, 0.02, 0.03])
    assert [p for _, p in got] == pytest.approx([0.25, 0.5, 0.25])


@pytest.mark.parametrize(
    "call",
    [
        lambda: tokens_per_step_pmf(-1, 0.5),
        lambda: tokens_per_step_pmf(2, 1.5),
        lambda: steps_pmf(-3, 2, 0.5),
        lambda: decode_time_pmf(3, 2, 0.5, 0.0),
        lambda: acceptance_for_tokens_per_step(0, 1.0),
        lambda: acceptance_for_tokens_per_step(4, 0.99),
        lambda: acceptance_for_tokens_per_step(4, 5.01),
        lambda: steps_moments(-1, 2, 0.5),
    ],
)
def test_bad_arguments_are_policy_errors(call: object) -> None:
    with pytest.raises(PolicyError):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(("k", "alpha"), [(1, 0.3), (3, 0.7), (4, 0.0), (5, 1.0), (2, 0.95)])
def test_steps_moments_are_the_pmf_moments(k: int, alpha: float) -> None:
    mean, second, drafts = steps_moments(40, k, alpha)
    for t in (0, 1, 2, 3, 7, 40):
        pmf = steps_pmf(t, k, alpha)
        assert mean[t] == pytest.approx(sum(s * p for s, p in enumerate(pmf)), abs=1e-12)
        assert second[t] == pytest.approx(sum(s * s * p for s, p in enumerate(pmf)), abs=1e-10)
    # drafts: min(k, left - 1) at every step, so with alpha == 0 one step per token
    if alpha == 0.0:
        assert drafts[7] == sum(min(k, r - 1) for r in range(1, 8))
    assert drafts[1] == 0.0 and mean[1] == 1.0


@pytest.mark.parametrize("k", [1, 3, 8])
def test_acceptance_for_tokens_per_step_inverts_the_mean(k: int) -> None:
    for tokens in (1.0, 1.3, (k + 2) / 2, k + 0.9, k + 1.0):
        alpha = acceptance_for_tokens_per_step(k, tokens)
        assert 0.0 <= alpha <= 1.0
        assert expected_tokens_per_step(k, alpha) == pytest.approx(tokens, abs=1e-9)
    assert acceptance_for_tokens_per_step(k, 1.0) == 0.0
    assert acceptance_for_tokens_per_step(k, k + 1.0) == 1.0


# -- the batcher ---------------------------------------------------------------------------


def _run(b: Batcher) -> tuple[list[float], list[int], float]:
    """Step until idle; durations, tokens per Tokens event, finish time."""
    t = 0.0
    durations: list[float] = []
    per_event: list[int] = []
    end = -1.0
    while b.has_work:
        r = b.step(t)
        durations.append(r.duration)
        for e in r.events:
            if isinstance(e, Tokens):
                per_event.append(e.n)
            if isinstance(e, Finished):
                end = e.t
        t = r.end
    return durations, per_event, end


def test_always_accepting_drafts_emits_k_plus_one_per_step_capped_at_the_end() -> None:
    p = _profile(spec_tokens=3, spec_acceptance=1.0, spec_draft_step_s=0.0005)
    b = Batcher(p)
    b.add("a", 8, 10, 0.0)
    durations, per_event, _ = _run(b)
    # prefill emits the first token; 9 left: 4 + 4 + 1 (the last step drafts nothing)
    assert per_event == [1, 4, 4, 1]
    assert len(durations) == 4
    # a step with 3 verified drafts: base + decode + 3 verify tokens + 3 draft passes
    assert durations[1] == pytest.approx(0.01 + 0.002 + 3 * 0.001 + 3 * 0.0005)
    assert durations[3] == pytest.approx(0.01 + 0.002)  # no drafts, no draft cost
    assert b.spec_draft_tokens == 6 and b.spec_accepted_tokens == 6


def test_never_accepting_drafts_is_one_token_per_step_at_a_higher_cost() -> None:
    plain = _run(_single(_profile()))
    spec = _run(_single(_profile(spec_tokens=2, spec_acceptance=0.0)))
    assert plain[1] == spec[1] == [1] * 6
    assert spec[2] > plain[2]  # drafting costs time and buys nothing


def _single(p: EngineProfile) -> Batcher:
    b = Batcher(p)
    b.add("a", 8, 6, 0.0)
    return b


def test_mean_tokens_per_step_matches_the_closed_form() -> None:
    k, alpha = 4, 0.7
    b = Batcher(_profile(spec_tokens=k, spec_acceptance=alpha), seed=7)
    for i in range(8):
        b.add(f"s{i}", 4, 400, 0.0)
    decode_events: list[int] = []
    seen: set[str] = set()
    t = 0.0
    while b.has_work:
        r = b.step(t)
        for e in r.events:
            if isinstance(e, Tokens):
                if e.seq_id in seen:  # the first Tokens of a sequence comes from its prefill
                    decode_events.append(e.n)
                seen.add(e.seq_id)
        t = r.end
    mean = sum(decode_events) / len(decode_events)
    # the cap at a reply's end lowers the mean a little; 3,192 tokens, seed fixed
    assert mean == pytest.approx(expected_tokens_per_step(k, alpha), rel=0.03)
    assert b.spec_accepted_tokens / b.spec_draft_tokens == pytest.approx(
        (expected_tokens_per_step(k, alpha) - 1) / k, rel=0.05
    )


def test_seeded_runs_repeat_and_different_seeds_differ() -> None:
    def run(seed: int) -> list[int]:
        b = Batcher(_profile(spec_tokens=3, spec_acceptance=0.6), seed=seed)
        b.add("a", 4, 200, 0.0)
        return _run(b)[1]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_every_sequence_still_emits_exactly_its_output_and_one_first_token() -> None:
    b = Batcher(_profile(spec_tokens=3, spec_acceptance=0.5, max_num_seqs=3), seed=3)
    outs = {f"s{i}": 5 + 7 * i for i in range(6)}
    for sid, n in outs.items():
        b.add(sid, 10, n, 0.0)
    got: dict[str, int] = {}
    firsts: list[str] = []
    t = 0.0
    while b.has_work:
        r = b.step(t)
        for e in r.events:
            if isinstance(e, Tokens):
                got[e.seq_id] = got.get(e.seq_id, 0) + e.n
            elif isinstance(e, FirstToken):
                firsts.append(e.seq_id)
        t = r.end
        for sid in b.seq_ids():
            st = b.seq_state(sid)
            assert st is not None
            if st.status == "running":
                assert st.num_blocks == -(-st.computed_tokens // 4)
    assert got == outs
    assert sorted(firsts) == sorted(outs)
