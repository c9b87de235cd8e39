"""Borrowing an unidentified coefficient from a donor's fit of the same fold."""

from __future__ import annotations

import dataclasses

import pytest

import velvetrope.engine.borrow as borrow_module
from velvetrope.engine.borrow import (
    PARAMETERS,
    THRESHOLD,
    Borrow,
    compute_scale,
    donor_fits,
    identified,
    max_share,
    shares,
)
from velvetrope.engine.fit_published import fit_profile, predict
from velvetrope.engine.holdout import holdout
from velvetrope.engine.profile import load_profile
from velvetrope.engine.published import PublishedPoint, read_default_table
from velvetrope.errors import PolicyError

from .test_fit_published import TINY
from .test_holdout import START, _row

PREFILL = "per_prefill_token_s"


def _rows() -> list[PublishedPoint]:
    """Source ``p``: prefill-heavy rows (long prompts, 2 output tokens); source ``d``:
    decode-heavy rows (2-token prompts, long outputs).  Values are TINY's own."""
    rows = []
    for batch in (1, 4, 8):
        rows.append(_row(f"p-thr-{batch}", "p", "throughput", batch, 200, 2))
        rows.append(_row(f"d-thr-{batch}", "d", "throughput", batch, 2, 200))
    rows.append(_row("p-ttft", "p", "ttft", 4, 200, 2))
    rows.append(_row("d-tpot", "d", "tpot", 8, 2, 200))
    values = {p.point.id: p.value for p in predict(rows, TINY)}
    return [dataclasses.replace(r, value=values[r.id]) for r in rows]


def test_scale_is_flops_ratio_over_gpu_ratio() -> None:
    # Llama-3-70B on 4 GPUs from Llama-3-8B on 1: 70.6 / 8.03 / 4 = 2.198
    scale = compute_scale(PARAMETERS["llama3-70b"], 4, PARAMETERS["llama3-8b"], 1)
    assert scale == pytest.approx(70.6 / 8.03 / 4, rel=1e-12)
    assert scale == pytest.approx(2.1980, abs=1e-4)
    assert compute_scale(70.6e9, 4, 8.03e9, 1, tp_efficiency=0.8) == pytest.approx(scale / 0.8)
    # the inverse direction undoes it
    back = compute_scale(PARAMETERS["llama3-8b"], 1, PARAMETERS["llama3-70b"], 4)
    assert scale * back == pytest.approx(1.0)
    with pytest.raises(PolicyError, match="tp_efficiency"):
        compute_scale(70.6e9, 4, 8.03e9, 1, tp_efficiency=1.5)
    with pytest.raises(PolicyError, match="GPU counts"):
        compute_scale(70.6e9, 0, 8.03e9, 1)


def test_share_rule_tells_prefill_heavy_rows_from_decode_heavy_ones() -> None:
    rows = _rows()
    start = TINY.with_overrides(**START)
    pre = [r for r in rows if r.source == "p"]
    dec = [r for r in rows if r.source == "d"]
    assert max_share(pre, start, PREFILL) > 0.5
    assert max_share(dec, start, PREFILL) < 0.1
    assert identified(pre, start, PREFILL, THRESHOLD)
    assert not identified(dec, start, PREFILL, THRESHOLD)
    # a share is a fraction of the modelled duration
    assert all(0.0 <= s <= 1.0 for s in shares(rows, start, PREFILL))
    assert max_share([], start, PREFILL) == 0.0
    with pytest.raises(PolicyError, match="not a coefficient"):
        shares(rows, start, "max_num_seqs")


def test_only_the_fold_whose_training_rows_miss_the_coefficient_borrows() -> None:
    rows = _rows()
    donor = TINY.with_overrides(name="donor", per_prefill_token_s=4e-4)
    borrow = Borrow(PREFILL, 2.5, THRESHOLD, "donor", {"p": donor, "d": donor})
    folds = {f.source: f for f in holdout(rows, TINY, START, borrow=borrow, max_iter=3)}
    # holding p out leaves only decode-heavy rows: prefill is borrowed, scaled
    ((name, value),) = folds["p"].borrowed
    assert name == PREFILL and value == pytest.approx(4e-4 * 2.5, rel=1e-12)
    assert folds["p"].fitted.per_prefill_token_s == pytest.approx(1e-3, rel=1e-3)
    # holding d out leaves the prefill-heavy rows: fitted, nothing borrowed
    assert folds["d"].borrowed == ()
    plain = {f.source: f for f in holdout(rows, TINY, START, max_iter=3)}
    assert folds["d"].fitted == plain["d"].fitted
    assert folds["p"].fitted.per_prefill_token_s != plain["p"].fitted.per_prefill_token_s
    # no donor fit for the fold: nothing borrowed
    none = Borrow(PREFILL, 2.5, THRESHOLD, "donor", {"p": None})
    again = {f.source: f for f in holdout(rows, TINY, START, borrow=none, max_iter=3)}
    assert again["p"].borrowed == () and again["p"].fitted == plain["p"].fitted
    with pytest.raises(PolicyError, match="not a coefficient"):
        Borrow("max_num_seqs", 2.0, THRESHOLD, "donor")


def test_donor_fit_never_sees_the_held_out_source(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows()
    extra = [dataclasses.replace(r, id="q" + r.id, source="q") for r in rows if r.source == "p"]
    donor_rows = [dataclasses.replace(r, profile="tiny") for r in rows + extra]
    seen: list[frozenset[str]] = []

    def spy(points: list[PublishedPoint], *args: object, **kw: object) -> object:
        seen.append(frozenset(p.source for p in points))
        return fit_profile(points, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(borrow_module, "fit_profile", spy)
    fits = donor_fits(donor_rows, TINY, START, ["p", "q", "x", "y"], PREFILL, THRESHOLD, max_iter=2)
    # one fit per training set; each excludes its held-out source; x and y share one
    assert seen == [frozenset({"d", "q"}), frozenset({"d", "p"}), frozenset({"d", "p", "q"})]
    assert fits["x"] is fits["y"] and fits["x"] is not None
    # a fit already made for a fold is reused, not refitted
    seen.clear()
    made = TINY.with_overrides(name="known")
    fits = donor_fits(
        donor_rows, TINY, START, ["p"], PREFILL, THRESHOLD, known={"p": made}, max_iter=2
    )
    assert fits["p"] is made and seen == []
    # a donor whose remaining rows do not identify the coefficient lends nothing
    only_decode = [r for r in donor_rows if r.source in ("d", "p")]
    assert donor_fits(only_decode, TINY, START, ["p"], PREFILL, THRESHOLD) == {"p": None}
    assert seen == []


# The datasheet starts of the V0 profiles (bench/fidelity_bench.py's _BEFORE, and the A100
# profile's fixed per_context_token_s).
_STARTS = {
    "llama3-70b-4xh100-vllm-v0": {
        "step_base_s": 0.0145,
        "per_prefill_token_s": 7.1e-05,
        "per_decode_seq_s": 5.9e-05,
        "per_context_token_s": 3.1e-08,
    },
    "llama3-8b-h100-vllm-v0": {
        "step_base_s": 0.006,
        "per_prefill_token_s": 2.95e-05,
        "per_decode_seq_s": 2.5e-05,
        "per_context_token_s": 4.9e-08,
    },
    "llama3-8b-a100-vllm-v0": {
        "step_base_s": 0.0097,
        "per_prefill_token_s": 9.4e-05,
        "per_decode_seq_s": 7.9e-05,
        "per_context_token_s": 8.8e-08,
    },
}


def test_the_shipped_table_leaves_prefill_unidentified_only_without_the_v060_blog() -> None:
    """Only the v0.6.0 blog has prefill-dominated rows for 70B on H100 and 8B on A100
    (its 462-in / 16-out burst); every other fold keeps one."""
    table = read_default_table()
    unidentified = []
    for name, start in _STARTS.items():
        rows = [p for p in table if p.profile == name]
        prof = load_profile(name).with_overrides(**start)
        for source in sorted({p.source for p in rows}):
            train = [p for p in rows if p.source != source]
            if not identified(train, prof, PREFILL, THRESHOLD):
                unidentified.append((name, source))
    assert sorted(unidentified) == [
        ("llama3-70b-4xh100-vllm-v0", "vllm-blog-060"),
        ("llama3-8b-a100-vllm-v0", "vllm-blog-060"),
    ]
