"""The engine model against every published vLLM result in the repository, fitted and held out.

Replays each row of ``velvetrope/engine/data/published_vllm.csv`` (or ``--table``) on the
engine model with the built-in profile the row names (or the profiles given with
``--profile NAME=PATH``), in that profile's own scheduler (``profile.scheduler``: the mode
the simulator, the engine server, the planner and calibration run), configured as the
source ran it, and compares the model's throughput, TTFT, TPOT and E2E latency with the
published values: the **fitted** figures (the shipped profiles were fitted to these rows).

Then the **held-out** figures (:mod:`velvetrope.engine.holdout`): for each profile, each
source in turn is left out, the profile's coefficients are fitted to the other sources'
rows from the datasheet-derived coefficients below (no row informed them), and the
left-out rows are replayed with that fit.  A profile with one source (the vLLM V1 profiles)
is predicted by the coefficients of the same hardware's vLLM 0.6 profile (fitted to other
sources only), run in the V1 scheduler.  A fold whose training rows do not identify a profile's
``per_prefill_token_s`` (:mod:`velvetrope.engine.borrow`: no row whose modelled duration
it dominates, more than half of it at the fit's start) fixes it at the
same fold's fit of a donor profile on the same GPU (``_BORROW``), scaled by parameters over
GPUs; the folds print what they borrowed.

Prints the MAPE per source and profile, fitted beside held out, and ends with exactly::

    fidelity: points=<n> heldout_points=<h> throughput_mape=<a> ttft_mape=<b> tpot_mape=<c> \
heldout_throughput_mape=<d> heldout_ttft_mape=<e> heldout_tpot_mape=<f>

(one line; the E2E figures, of the V1 rows, are on the line before it).  Targets: fitted
<= 0.10, held out <= 0.12.  ``--no-holdout`` skips the held-out fits; ``--before`` also
replays the table with the profiles' datasheet-derived coefficients.

Run: ``.venv/bin/python bench/fidelity_bench.py`` (a few minutes: one fit per source and
profile).  Deterministic (seeded workloads).  Exit status 0 whether or not the targets are
met: this is a measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

from velvetrope.engine.borrow import (
    PARAMETERS,
    THRESHOLD,
    Borrow,
    compute_scale,
    donor_fits,
    max_share,
)
from velvetrope.engine.fit_published import METRICS, mape, predict, summary_line
from velvetrope.engine.fit_report import render_predictions
from velvetrope.engine.holdout import Fold, holdout
from velvetrope.engine.profile import COEFFICIENTS, EngineProfile, load_profile
from velvetrope.engine.published import PublishedPoint, load_table, read_default_table
from velvetrope.engine.replay import Prediction

# The coefficients the built-in profiles had before they were fitted to the table
# (derived from datasheets; `git show` the profile files of the previous release).
_BEFORE: dict[str, dict[str, float | int]] = {
    "llama3-8b-h100": {
        "step_base_s": 0.006,
        "per_prefill_token_s": 2.95e-05,
        "per_decode_seq_s": 2.5e-05,
        "per_context_token_s": 4.9e-08,
        "max_num_seqs": 1024,
    },
    "llama3-8b-a100": {
        "step_base_s": 0.0097,
        "per_prefill_token_s": 9.4e-05,
        "per_decode_seq_s": 7.9e-05,
        "per_context_token_s": 8.0e-08,
        "max_num_seqs": 256,
    },
    "llama3-70b-4xh100": {
        "step_base_s": 0.0145,
        "per_prefill_token_s": 7.1e-05,
        "per_decode_seq_s": 5.9e-05,
        "per_context_token_s": 3.1e-08,
        "max_num_seqs": 1024,
        "tp_per_token_s": 0.0,
    },
}


# Profiles fitted with a coefficient held fixed (see the profile's header), held the same
# way in the held-out fits.
_FIXED: dict[str, dict[str, float]] = {
    "llama3-8b-a100-vllm-v0": {"per_context_token_s": 8.8e-08},
}
# A profile with a single source is held out with the coefficients of the same hardware's
# profile of another engine version (fitted to other sources only).
_TRANSFER = {
    "llama3-8b-h100-vllm-v1": "llama3-8b-h100-vllm-v0",
    "llama3-70b-4xh100-vllm-v1": "llama3-70b-4xh100-vllm-v0",
}

# A profile whose fold does not identify a coefficient borrows it from a donor on the same
# GPU model, fitted in the same fold: recipient -> (donor, coefficient, recipient's and
# donor's PARAMETERS key).  Prefill cost per token ~ FLOPs per token / aggregate compute.
_BORROW = {
    "llama3-70b-4xh100-vllm-v0": (
        "llama3-8b-h100-vllm-v0",
        "per_prefill_token_s",
        "llama3-70b",
        "llama3-8b",
    ),
}


def _hardware(profile: str) -> str:
    """The ``_BEFORE`` key of a profile: its name without the engine-version suffix."""
    return profile.removesuffix("-vllm-v0").removesuffix("-vllm-v1")


def _replay(points: list[PublishedPoint], profiles: dict[str, EngineProfile]) -> list[Prediction]:
    by_profile: dict[str, list[PublishedPoint]] = defaultdict(list)
    for p in points:
        by_profile[p.profile].append(p)
    preds: list[Prediction] = []
    for name, rows in by_profile.items():
        preds.extend(predict(rows, profiles[name]))
    return preds


def _start(name: str) -> dict[str, float] | None:
    before = _BEFORE.get(_hardware(name))
    return None if before is None else {k: float(before[k]) for k in COEFFICIENTS}


def _borrow(
    name: str,
    rows: list[PublishedPoint],
    points: list[PublishedPoint],
    profiles: dict[str, EngineProfile],
    done: dict[str, list[Fold]],
) -> Borrow | None:
    """``name``'s :class:`Borrow`: its donor fitted per held-out source of ``rows``."""
    if name not in _BORROW:
        return None
    donor, coefficient, params, donor_params = _BORROW[name]
    donor_start = _start(donor)
    donor_rows = [p for p in points if p.profile == donor]
    if donor not in profiles or donor_start is None or not donor_rows:
        return None
    scale = compute_scale(
        PARAMETERS[params],
        profiles[name].tensor_parallel_size,
        PARAMETERS[donor_params],
        profiles[donor].tensor_parallel_size,
    )
    known = {f.source: f.fitted for f in done.get(donor, []) if f.trained_on and not f.borrowed}
    fits = donor_fits(
        donor_rows,
        profiles[donor],
        donor_start,
        sorted({p.source for p in rows}),
        coefficient,
        THRESHOLD,
        fixed=_FIXED.get(donor),
        known=known,
    )
    return Borrow(coefficient, scale, THRESHOLD, donor, fits)


def _held_out(points: list[PublishedPoint], profiles: dict[str, EngineProfile]) -> list[Fold]:
    done: dict[str, list[Fold]] = {}
    # donors first, so their folds are reused as the same fold's donor fits
    donors = {d for d, *_ in _BORROW.values()}
    for name in sorted(profiles, key=lambda n: (n not in donors, n)):
        rows = [p for p in points if p.profile == name]
        start = _start(name)
        if not rows or start is None:
            continue
        donor = _TRANSFER.get(name)
        fallback = None
        if donor is not None:
            fallback = profiles[donor] if donor in profiles else load_profile(donor)
        borrow = _borrow(name, rows, points, profiles, done)
        done[name] = holdout(
            rows,
            profiles[name],
            start,
            fixed=_FIXED.get(name),
            fallback=fallback,
            borrow=borrow,
        )
        if borrow is not None:
            _report_shares(name, rows, profiles[name], start, borrow)
    return [f for name in sorted(done) for f in done[name]]


def _report_shares(
    name: str,
    rows: list[PublishedPoint],
    profile: EngineProfile,
    start: dict[str, float],
    borrow: Borrow,
) -> None:
    """Print, per fold, the largest share of ``borrow.coefficient`` among its training
    rows, the verdict and the donor's scaled value."""
    check = profile.with_overrides(**{**start, **_FIXED.get(name, {})})
    for source in sorted({p.source for p in rows}):
        train = [p for p in rows if p.source != source]
        share = max_share(train, check, borrow.coefficient) if train else 0.0
        verdict = "identified" if share > borrow.threshold else "not identified"
        value = borrow.value(source)
        donor = f"{value * 1e6:.2f} us" if value is not None else "none"
        print(
            f"borrow: {name} without {source}: max {borrow.coefficient} share {share:.3f} "
            f"({verdict}); {borrow.donor} x {borrow.scale:.4f} = {donor}"
        )


def _cells(m: dict[str, float]) -> str:
    return "  ".join(f"{m[k]:>9.3f}" if m[k] == m[k] else f"{'-':>9}" for k in METRICS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", help="a published-results CSV (default: the shipped one)")
    ap.add_argument(
        "--profile", action="append", default=[], help="NAME=PATH: use PATH for rows of NAME"
    )
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--before", action="store_true", help="also replay the unfitted profiles")
    ap.add_argument("--no-holdout", action="store_true", help="skip the held-out fits")
    args = ap.parse_args(argv)

    points = load_table(args.table) if args.table else read_default_table()
    names = sorted({p.profile for p in points})
    overrides = dict(item.split("=", 1) for item in args.profile)
    profiles = {n: load_profile(overrides.get(n, n)) for n in names}
    sources = sorted({p.source for p in points})
    print(f"{len(points)} published rows, {len(sources)} sources ({', '.join(sources)})")
    for n in names:
        prof = profiles[n]
        print(
            f"profile {n}: scheduler {prof.scheduler} (num_scheduler_steps "
            f"{prof.num_scheduler_steps}), {prof.max_num_seqs} seats, budget "
            f"{prof.max_num_batched_tokens}"
        )

    if args.before:
        old = {
            n: profiles[n].with_overrides(**_BEFORE[_hardware(n)])
            for n in names
            if _hardware(n) in _BEFORE
        }
        before = _replay([p for p in points if p.profile in old], old)
        print("before the fit (derived coefficients):")
        print("  " + summary_line(before).replace("fidelity:", "fidelity-before:"))

    t0 = time.perf_counter()
    preds = _replay(points, profiles)
    print(f"replayed in {time.perf_counter() - t0:.1f} s")
    if args.rows:
        for q in preds:
            print(
                f"{q.point.id:<48} {q.point.metric:<10} model {q.value:>10.4g} "
                f"published {q.point.value:>10.4g} {q.rel_error:+7.1%}"
                + (" approx" if q.point.approx else "")
            )
    held: list[Prediction] = []
    if not args.no_holdout:
        t0 = time.perf_counter()
        folds = _held_out(points, profiles)
        print(f"held-out fits in {time.perf_counter() - t0:.1f} s")
        header = "  ".join(f"{k + '_mape':>9}" for k in METRICS)
        print(f"held out: {'profile':<26} {'source':<14} rows  {header}  fitted on")
        for f in folds:
            held.extend(f.predictions)
            on = ", ".join(f.trained_on) or f"{_TRANSFER.get(f.profile, '?')} (transfer)"
            on += "".join(f"; {k} {v * 1e6:.2f} us borrowed" for k, v in f.borrowed)
            print(
                f"held out: {f.profile:<26} {f.source:<14} {len(f.predictions):>4}  "
                f"{_cells(mape(f.predictions))}  {on}"
            )
    for name in names:
        fitted = mape([q for q in preds if q.point.profile == name])
        out = mape([q for q in held if q.point.profile == name])
        print(f"profile {name:<26} fitted   {_cells(fitted)}")
        if held:
            print(f"profile {name:<26} held out {_cells(out)}")
    sys.stdout.write(render_predictions(preds, heldout=held or None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
