"""The engine model against every published vLLM result in the repository.

Replays each row of ``velvetrope/engine/data/published_vllm.csv`` (or ``--table``) on the
engine model with the built-in profile the row names (or the profiles given with
``--profile NAME=PATH``), with the engine configuration the source ran, and compares the
model's throughput, TTFT and TPOT with the published values.  Prints one line per row
(``--rows``), the MAPE per source and profile, and ends with exactly::

    fidelity: points=<n> throughput_mape=<a> ttft_mape=<b> tpot_mape=<c>

the mean absolute percentage error per metric over every row of that metric.  Targets:
each <= 0.10.  ``--before`` also replays the table with the profiles as they were before
the fit (the derived, unfitted coefficients of release 0.x, kept in this script) and prints
that line first, labelled, so the improvement is measured in the same run.

Run: ``.venv/bin/python bench/fidelity_bench.py`` (about 10 s).  Deterministic (seeded
workloads).  Exit status 0 whether or not the targets are met: this is a measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

from velvetrope.engine.fit_published import mape, predict, summary_line
from velvetrope.engine.fit_report import render_predictions
from velvetrope.engine.profile import EngineProfile, load_profile
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


def _replay(points: list[PublishedPoint], profiles: dict[str, EngineProfile]) -> list[Prediction]:
    by_profile: dict[str, list[PublishedPoint]] = defaultdict(list)
    for p in points:
        by_profile[p.profile].append(p)
    preds: list[Prediction] = []
    for name, rows in by_profile.items():
        preds.extend(predict(rows, profiles[name]))
    return preds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", help="a published-results CSV (default: the shipped one)")
    ap.add_argument(
        "--profile", action="append", default=[], help="NAME=PATH: use PATH for rows of NAME"
    )
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--before", action="store_true", help="also replay the unfitted profiles")
    args = ap.parse_args(argv)

    points = load_table(args.table) if args.table else read_default_table()
    names = sorted({p.profile for p in points})
    overrides = dict(item.split("=", 1) for item in args.profile)
    profiles = {n: load_profile(overrides.get(n, n)) for n in names}
    sources = sorted({p.source for p in points})
    print(f"{len(points)} published rows, {len(sources)} sources ({', '.join(sources)})")
    print(f"profiles: {', '.join(f'{n} ({profiles[n].max_num_seqs} seqs)' for n in names)}")

    if args.before:
        old = {n: profiles[n].with_overrides(**_BEFORE[n]) for n in names if n in _BEFORE}
        before = _replay([p for p in points if p.profile in old], old)
        print("before the fit (derived coefficients):")
        print("  " + summary_line(before).replace("fidelity:", "fidelity-before:"))

    t0 = time.perf_counter()
    preds = _replay(points, profiles)
    elapsed = time.perf_counter() - t0
    if args.rows:
        for q in preds:
            print(
                f"{q.point.id:<48} {q.point.metric:<10} model {q.value:>10.4g} "
                f"published {q.point.value:>10.4g} {q.rel_error:+7.1%}"
                + (" approx" if q.point.approx else "")
            )
    for name in names:
        m = mape([q for q in preds if q.point.profile == name])
        cells = " ".join(f"{k}_mape={v:.3f}" for k, v in m.items())
        print(f"profile {name}: {cells}")
    print(f"replayed in {elapsed:.1f} s")
    sys.stdout.write(render_predictions(preds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
