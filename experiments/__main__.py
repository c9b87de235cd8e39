"""Rerun every study, then regenerate the verdict table: ``python -m experiments``.

Every ``experiments/*/run.py`` runs as ``python -m experiments.<dir>.run`` from the
repository root, ``--jobs`` at a time (2 by default: the studies are deterministic, so the
order and overlap of the runs do not change a byte); each study's output is printed once it
ends, in directory order. The table in
``experiments/README.md`` is rewritten last (``experiments.index``). Exit status 1 if any
study failed; the table is then left alone. ``--only a,h`` runs the studies whose directory
starts with one of those prefixes; ``--index`` only rewrites the table.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from experiments.index import EXPERIMENTS, studies, update_readme


def _run(study: Path) -> tuple[Path, int, float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", f"experiments.{study.name}.run"],
        cwd=EXPERIMENTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return study, proc.returncode, time.perf_counter() - t0, proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments", description=__doc__)
    ap.add_argument("--jobs", type=int, default=2, help="studies run at once (default 2)")
    ap.add_argument("--only", default="", help="comma-separated directory prefixes")
    ap.add_argument("--index", action="store_true", help="only rewrite the verdict table")
    args = ap.parse_args(argv)
    todo = studies()
    if args.only:
        prefixes = tuple(p.strip() for p in args.only.split(",") if p.strip())
        todo = [s for s in todo if s.name.startswith(prefixes)]
    failed: list[str] = []
    if not args.index:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for study, rc, took, log in pool.map(_run, todo):
                print(log, end="", flush=True)
                print(f"== {study.name}: exit {rc} in {took:.0f} s", flush=True)
                if rc != 0:
                    failed.append(study.name)
        print(f"== {len(todo)} studies in {time.perf_counter() - t0:.0f} s", flush=True)
    if failed:
        print(f"== failed: {', '.join(failed)}; the verdict table is left as it was")
        return 1
    changed = update_readme()
    print(f"== experiments/README.md verdict table {'rewritten' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
