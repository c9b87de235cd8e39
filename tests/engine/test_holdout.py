"""Held-out validation: each source is predicted by a fit that never saw it."""

from __future__ import annotations

import dataclasses

import pytest

from velvetrope.engine.fit_published import predict
from velvetrope.engine.holdout import holdout
from velvetrope.engine.profile import COEFFICIENTS, EngineProfile
from velvetrope.engine.published import PublishedPoint
from velvetrope.errors import PolicyError

from .test_fit_published import TINY, _point

TRUTH = TINY
START = {
    "step_base_s": 0.02,
    "per_prefill_token_s": 0.0006,
    "per_decode_seq_s": 0.003,
    "per_context_token_s": 0.00005,
}


def _row(
    pid: str, source: str, metric: str, batch: int, length: int, output: int | None = None
) -> PublishedPoint:
    """A made-up published row: ``length`` prompt tokens and ``output`` output tokens
    (``length`` too when not given)."""
    thr = metric == "throughput"
    return _point(
        id=pid,
        source=source,
        metric=metric,
        stat="total" if thr else "mean",
        unit="total_tok_s" if thr else "ms",
        num_prompts=batch,
        prompt_tokens=length,
        output_tokens=length if output is None else output,
        note="made up",
    )


def _rows(truth: EngineProfile) -> list[PublishedPoint]:
    """Two sources, each with throughput, TTFT and TPOT rows made by ``truth``."""
    rows = []
    for source, lengths in (("a", (32, 64)), ("b", (48, 96))):
        for batch in (1, 8, 32):
            for length in lengths:
                rows.append(
                    _row(f"{source}-thr-{batch}-{length}", source, "throughput", batch, length)
                )
        rows.append(_row(f"{source}-ttft", source, "ttft", 4, lengths[1]))
        rows.append(_row(f"{source}-tpot", source, "tpot", 16, lengths[0]))
    values = {p.point.id: p.value for p in predict(rows, truth)}
    return [dataclasses.replace(r, value=values[r.id]) for r in rows]


def test_each_source_is_predicted_by_a_fit_on_the_others() -> None:
    rows = _rows(TRUTH)
    folds = holdout(rows, TRUTH, START, max_iter=6)
    assert [(f.source, f.trained_on) for f in folds] == [("a", ("b",)), ("b", ("a",))]
    for f in folds:
        assert {p.point.source for p in f.predictions} == {f.source}
        # the data are exactly the truth's, so a fit on either source recovers it
        assert max(abs(p.rel_error) for p in f.predictions) < 0.02, f.source
    # what a held-out source published never reaches its own prediction
    moved = [dataclasses.replace(r, value=r.value * 1.5) if r.source == "a" else r for r in rows]
    again = holdout(moved, TRUTH, START, max_iter=6)
    assert [p.value for p in again[0].predictions] == [p.value for p in folds[0].predictions]
    assert again[1].fitted != folds[1].fitted  # the other fold trained on the moved rows


def test_a_single_source_is_predicted_by_the_fallback_in_the_profile_s_own_scheduler() -> None:
    rows = [r for r in _rows(TRUTH) if r.source == "a"]
    assert holdout(rows, TRUTH, START) == []
    donor = TRUTH.with_overrides(
        name="donor", step_base_s=0.03, scheduler="vllm-v0", num_scheduler_steps=4
    )
    (fold,) = holdout(rows, TRUTH, START, fallback=donor)
    assert fold.trained_on == ()
    assert fold.fitted.scheduler == "vllm-v1" and fold.fitted.name == "tiny"
    assert [getattr(fold.fitted, k) for k in COEFFICIENTS] == [
        getattr(donor, k) for k in COEFFICIENTS
    ]
    assert all(p.rel_error > 0 for p in fold.predictions if p.point.metric != "throughput")


def test_holdout_arguments_are_checked() -> None:
    rows = _rows(TRUTH)
    with pytest.raises(PolicyError, match="rows of profile 'other' only"):
        holdout(rows, TRUTH.with_overrides(name="other"), START)
    with pytest.raises(PolicyError, match="not coefficients"):
        holdout(rows, TRUTH, {"max_num_seqs": 3.0})
    assert holdout([], TRUTH, START) == []
