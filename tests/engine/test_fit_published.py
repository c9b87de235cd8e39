"""Published results: the table, exact replays, the offline fit and its command line."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.engine import Batcher, EngineProfile, list_profiles, load_profile
from velvetrope.engine.fit_published import fit_profile, mape, predict, summary_line
from velvetrope.engine.published import (
    PublishedPoint,
    Scenario,
    load_table,
    read_default_table,
    sharegpt_sample,
)
from velvetrope.engine.replay import engine_for, replay, theta_of
from velvetrope.errors import ConfigError, PolicyError

TINY = EngineProfile(
    name="tiny",
    description="test",
    step_base_s=0.01,
    per_prefill_token_s=0.001,
    per_decode_seq_s=0.002,
    per_context_token_s=0.0001,
    block_size=4,
    num_gpu_blocks=4096,
    max_num_seqs=64,
    max_num_batched_tokens=256,
    max_model_len=1024,
)


def _point(**kw: object) -> PublishedPoint:
    base: dict[str, object] = {
        "id": "p",
        "source": "s",
        "profile": "tiny",
        "hardware": "",
        "tp": 1,
        "model": "",
        "engine": "",
        "frontend": "offline",
        "workload": "fixed",
        "prompt_tokens": 8,
        "output_tokens": 3,
        "num_prompts": 1,
        "arrival": "burst",
        "rate_rps": None,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 256,
        "scheduler_steps": 1,
        "scheduler": "vllm-v1",
        "metric": "ttft",
        "stat": "mean",
        "value": 1.0,
        "unit": "ms",
        "approx": False,
        "note": "",
    }
    base.update(kw)
    return PublishedPoint(**base)  # type: ignore[arg-type]


def _scenario(
    points: list[PublishedPoint], prompts: list[int], outputs: list[int], arrivals: list[float]
) -> Scenario:
    return Scenario(
        points[0].scenario_key(),
        tuple(points),
        np.array(prompts, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
        np.array(arrivals, dtype=np.float64),
    )


# -- the shipped table -----------------------------------------------------------------------


def test_the_shipped_table_covers_every_profile_from_enough_sources() -> None:
    pts = read_default_table()
    assert len(pts) >= 20
    assert len({p.source for p in pts}) >= 4
    assert {p.profile for p in pts} == {
        "llama3-8b-h100-vllm-v0",
        "llama3-8b-a100-vllm-v0",
        "llama3-70b-4xh100-vllm-v0",
        "llama3-8b-h100-vllm-v1",
        "llama3-70b-4xh100-vllm-v1",
    }
    assert {p.profile for p in pts} <= set(list_profiles())
    for p in pts:  # every row runs in the scheduler of the profile it names
        assert p.scheduler == load_profile(p.profile).scheduler, p.id
    for metric in ("throughput", "ttft", "tpot", "e2e"):
        assert any(p.metric == metric for p in pts)
    assert all(p.note for p in pts), "every row says where its number comes from"


def test_every_shipped_row_states_the_seats_its_source_ran() -> None:
    """No row leaves max_num_seqs to a fit: the v0.6.0 blog's runs used its benchmark
    suite's --max-num-seqs 512 (the table's note cites it); the others state 256 or V1's
    1024.  Every replay runs with the row's seats, whatever the profile's default."""
    pts = read_default_table()
    assert all(p.max_num_seqs is not None for p in pts)
    blog = [p for p in pts if p.source == "vllm-blog-060"]
    assert blog and {p.max_num_seqs for p in blog} == {512}
    assert all("nightly-tests.json" in p.note for p in blog)
    for p in blog:
        profile = load_profile(p.profile)
        assert profile.max_num_seqs == 256  # vLLM 0.6's default, not what the blog ran
        assert engine_for(profile, p).max_num_seqs == 512


def test_the_sharegpt_sample_is_the_published_one() -> None:
    prompts, outputs = sharegpt_sample()
    assert len(prompts) == 303  # 320 requests, 17 without any output token
    assert prompts.min() >= 1 and outputs.min() >= 1


def test_the_shipped_profiles_reproduce_the_table_within_the_stated_error() -> None:
    pts = read_default_table()
    preds = []
    for name in {p.profile for p in pts}:
        preds += predict([p for p in pts if p.profile == name], load_profile(name))
    errors = mape(preds)
    assert errors["throughput"] <= 0.10, summary_line(preds)
    assert errors["ttft"] <= 0.10, summary_line(preds)
    assert errors["tpot"] <= 0.10, summary_line(preds)
    # the vLLM V1 rows (E2E latency, one source, only the step floor fitted) miss the 0.10
    # target: the published curves' knees beyond ~55 req/s (8B) and ~25 req/s (70B) are
    # sharper than the model's (bench/fidelity_bench.py: e2e_mape=0.172)
    assert errors["e2e"] <= 0.20, summary_line(preds)


# -- reading tables ------------------------------------------------------------------------


def _write_table(path: Path, rows: list[dict[str, str]]) -> Path:
    cols = list(rows[0])
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def _as_row(p: PublishedPoint) -> dict[str, str]:
    """A table row (CSV strings) for ``p``."""
    out: dict[str, str] = {}
    for k, v in dataclasses.asdict(p).items():
        out[k] = "" if v is None else ("1" if v else "0") if isinstance(v, bool) else str(v)
    return out


def _row(**kw: str) -> dict[str, str]:
    row = _as_row(_point(value=12.5, note="made up"))
    row.update(kw)
    return row


def test_a_table_round_trips_its_fields(tmp_path: Path) -> None:
    pts = load_table(
        _write_table(tmp_path / "t.csv", [_row(id="a"), _row(id="b", max_num_seqs="")])
    )
    assert [p.id for p in pts] == ["a", "b"]
    assert pts[0].value == 12.5 and pts[0].max_num_seqs == 64 and pts[1].max_num_seqs is None


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"metric": "latency"}, "row 2: column 'metric'"),
        ({"value": "-3"}, "row 2: column 'value'"),
        ({"approx": "yes"}, "row 2: column 'approx'"),
        ({"arrival": "poisson"}, "row 2: column 'rate_rps'"),
        ({"unit": "req_s"}, "row 2: column 'unit'"),
        ({"max_num_batched_tokens": "8"}, "row 2: column 'max_num_batched_tokens'"),
    ],
)
def test_bad_rows_name_the_row_and_the_column(
    tmp_path: Path, change: dict[str, str], needle: str
) -> None:
    path = _write_table(tmp_path / "bad.csv", [_row(**change)])
    with pytest.raises(ConfigError, match=needle):
        load_table(path)


def test_duplicate_ids_and_missing_columns_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="duplicate id"):
        load_table(_write_table(tmp_path / "d.csv", [_row(), _row()]))
    row = _row()
    del row["scheduler"]
    with pytest.raises(ConfigError, match="missing column"):
        load_table(_write_table(tmp_path / "m.csv", [row]))


# -- exact replays -----------------------------------------------------------------------------


def test_a_single_request_replays_to_the_step_formula() -> None:
    pts = [_point(id="ttft"), _point(id="tpot", metric="tpot")]
    ttft, tpot = replay(_scenario(pts, [8], [3], [0.0]), TINY)
    assert ttft.value == pytest.approx(1000 * TINY.step_time(8, 0, 8))
    # two decode steps, attending 9 then 10 cached tokens
    two = TINY.step_time(0, 1, 9) + TINY.step_time(0, 1, 10)
    assert tpot.value == pytest.approx(1000 * two / 2)


def test_throughput_counts_the_stated_unit_over_the_whole_run() -> None:
    units = ("req_s", "out_tok_s", "total_tok_s")
    pts = [_point(id=u, metric="throughput", stat="total", unit=u) for u in units]
    preds = replay(_scenario(pts, [8, 8], [3, 3], [0.0, 0.0]), TINY)
    span = TINY.step_time(16, 0, 16) + TINY.step_time(0, 2, 18) + TINY.step_time(0, 2, 20)
    assert [p.value for p in preds] == pytest.approx([2 / span, 6 / span, 22 / span])


V0 = TINY.with_overrides(name="tiny-v0", scheduler="vllm-v0")


def test_multi_step_scheduling_admits_a_newcomer_only_at_a_window_boundary() -> None:
    pts = [_point(scheduler_steps=4, scheduler="vllm-v0")]
    first = V0.step_time(8, 0, 8)
    # the second request arrives during the first decode step (step 2 of the window)
    (pred,) = replay(_scenario(pts, [8, 8], [20, 1], [0.0, first + 0.001]), V0)
    steps = [first] + [V0.step_time(0, 1, 8 + i) for i in range(1, 4)]
    join = V0.step_time(8, 0, 8)  # step 5: the newcomer's prompt runs alone (V0)
    ttft_second = sum(steps) + join - (first + 0.001)
    assert pred.value == pytest.approx(1000 * (first + ttft_second) / 2)


def test_multi_step_scheduling_lives_in_the_batcher() -> None:
    b = Batcher(V0.with_overrides(num_scheduler_steps=3))
    b.add("a", 8, 20, 0.0)
    t = b.step(0.0).end  # step 1: a's prompt (nothing was running: admits at once)
    b.add("b", 8, 20, t)
    for _ in range(2):  # steps 2 and 3 of the window: b waits
        r = b.step(t)
        assert (r.prefill_tokens, r.decode_seqs) == (0, 1)
        t = r.end
    assert b.step(t).prefill_tokens == 8  # step 4 opens the next window


def test_a_row_of_another_scheduler_is_refused() -> None:
    pts = [_point(scheduler="vllm-v0")]
    with pytest.raises(PolicyError, match="models vllm-v1"):
        replay(_scenario(pts, [8], [3], [0.0]), TINY)


def test_v0_prefill_first_runs_prompts_in_steps_of_their_own() -> None:
    b = Batcher(V0)
    b.add("a", 8, 10, 0.0)
    t = b.step(0.0).end
    b.add("b", 8, 10, t)
    r = b.step(t)
    assert (r.prefill_tokens, r.decode_seqs) == (8, 0)  # a waits while b's prompt runs
    assert b.step(r.end).decode_seqs == 2


def test_the_linear_forms_give_back_the_simulated_values() -> None:
    p = _point(
        arrival="poisson",
        rate_rps=20.0,
        num_prompts=60,
        workload="sharegpt",
        prompt_tokens=None,
        output_tokens=None,
        stat="median",
    )
    q = dataclasses.replace(p, id="q", metric="tpot", stat="mean")
    prof = TINY.with_overrides(max_model_len=2048, num_gpu_blocks=8192)
    from velvetrope.engine.published import scenarios

    (sc,) = scenarios([p, q], seed=3)
    for pred in replay(sc, prof):
        assert pred.at(theta_of(prof)) == pytest.approx(pred.value, rel=1e-9)


# -- the fit ---------------------------------------------------------------------------------------


def _synthetic(truth: EngineProfile, seats: int | None = 64) -> list[PublishedPoint]:
    """Rows whose values are what ``truth`` predicts (so a fit can recover it)."""
    rows: list[PublishedPoint] = []
    for b, length in ((1, 32), (8, 64), (32, 32), (32, 128)):
        rows.append(
            _point(
                id=f"thr-{b}-{length}",
                metric="throughput",
                stat="total",
                unit="total_tok_s",
                num_prompts=b,
                prompt_tokens=length,
                output_tokens=length,
                max_num_seqs=seats,
            )
        )
    rows.append(
        _point(id="ttft", prompt_tokens=200, output_tokens=1, num_prompts=4, max_num_seqs=seats)
    )
    rows.append(
        _point(
            id="tpot",
            metric="tpot",
            prompt_tokens=16,
            output_tokens=64,
            num_prompts=100,
            max_num_seqs=seats,
            unit="ms",
        )
    )
    values = {p.point.id: p.value for p in predict(rows, truth)}
    return [dataclasses.replace(r, value=values[r.id]) for r in rows]


def test_the_fit_recovers_the_coefficients_that_made_the_data() -> None:
    truth = TINY
    start = TINY.with_overrides(
        step_base_s=0.02,
        per_prefill_token_s=0.0006,
        per_decode_seq_s=0.003,
        per_context_token_s=0.00005,
    )
    fit = fit_profile(_synthetic(truth), start, name="refit")
    assert fit.profile.name == "refit"
    for k in ("step_base_s", "per_prefill_token_s", "per_decode_seq_s"):
        assert getattr(fit.profile, k) == pytest.approx(getattr(truth, k), rel=0.02), k
    assert max(fit.mape.values()) < 0.01


def test_fixed_coefficients_stay_put() -> None:
    fit = fit_profile(_synthetic(TINY), TINY, fixed={"per_context_token_s": 0.0002})
    assert fit.profile.per_context_token_s == 0.0002


def test_an_unpublished_max_num_seqs_is_found() -> None:
    truth = TINY.with_overrides(max_num_seqs=512, max_num_batched_tokens=512)
    rows = [
        _point(
            id="burst",
            metric="throughput",
            stat="total",
            unit="req_s",
            num_prompts=400,
            prompt_tokens=8,
            output_tokens=8,
            max_num_seqs=None,
            max_num_batched_tokens=512,
        ),
        _point(
            id="ttft",
            num_prompts=400,
            prompt_tokens=8,
            output_tokens=8,
            max_num_seqs=None,
            max_num_batched_tokens=512,
        ),
    ]
    values = {p.point.id: p.value for p in predict(rows, truth)}
    rows = [dataclasses.replace(r, value=values[r.id]) for r in rows]
    fit = fit_profile(rows, TINY.with_overrides(max_num_batched_tokens=512), max_iter=3)
    assert fit.profile.max_num_seqs == 512


def test_fit_arguments_are_checked() -> None:
    with pytest.raises(PolicyError, match="no published rows"):
        fit_profile([], TINY)
    with pytest.raises(PolicyError, match="one profile"):
        fit_profile([_point(), _point(id="x", profile="other")], TINY)
    with pytest.raises(PolicyError, match="cannot fix"):
        fit_profile([_point()], TINY, fixed={"max_model_len": 3.0})


# -- the command line --------------------------------------------------------------------------


def test_calibrate_from_a_table_writes_a_loadable_profile(tmp_path: Path) -> None:
    truth = load_profile("llama3-8b-h100").with_overrides(max_num_seqs=256)
    rows = [
        dataclasses.replace(r, profile="llama3-8b-h100", max_num_batched_tokens=8192, note="x")
        for r in _synthetic(truth, seats=256)
    ]
    values = {p.point.id: p.value for p in predict(rows, truth)}
    table = [_as_row(dataclasses.replace(r, value=values[r.id])) for r in rows]
    path = _write_table(tmp_path / "t.csv", table)
    out = tmp_path / "fitted.yaml"
    res = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--from-table",
            str(path),
            "--profile",
            "llama3-8b-h100",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "fidelity: points=6" in res.output
    fitted = load_profile(str(out))
    assert fitted.step_base_s == pytest.approx(truth.step_base_s, rel=0.05)
    assert out.read_text().startswith("# fitted by `velvetrope calibrate --from-table`")


def test_calibrate_without_an_endpoint_or_a_table_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["calibrate"])
    assert res.exit_code == 2 and "--from-table" in res.output
    res = CliRunner().invoke(
        app, ["calibrate", "--from-table", "builtin", "--profile", "no-such-profile"]
    )
    assert res.exit_code == 2 and "no rows of profile" in res.output
