"""Check the figures the README and the docs quote from deterministic commands: ``python -m
harness.readme_figures`` (``--list`` to print the checks without running them).

A figure is deterministic when its command runs only the simulator or the planner on fixed
seeds (virtual time, no wall clock, no network): rerun on the same code it prints the same
line. Each check runs one such command from the repository root, takes the ``key=value``
tokens of the output line that starts with its prefix, and requires each quoted key's
``key=value`` to appear verbatim in the page that quotes it (:attr:`Check.page`: README.md,
or the docs page the figure moved to). Measurements on a shared machine (the gateway, Redis
and path-cost benches, RSS, wall times) are not checked: they cannot be byte-identical.
Exit status 1, with the stale figures, when any check fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


@dataclass(frozen=True)
class Check:
    """A command, the prefix of its result line, the keys a page quotes, and that page."""

    argv: tuple[str, ...]
    prefix: str
    keys: tuple[str, ...]
    page: Path = README


def _suite_lines(*args: str) -> tuple[Check, Check]:
    """The checks of ``bench/policy_suite.py *args``: its ``policy:`` and ``settled:`` lines'
    counts and ratios, as ``docs/concepts/slo-limits.md`` quotes them."""
    argv = ("bench/policy_suite.py", *args)
    page = ROOT / "docs" / "concepts" / "slo-limits.md"
    ratios = ("tiers_at_or_above", "total_ratio_min", "total_ratio_mean")
    return Check(argv, "policy:", ("workloads", *ratios), page), Check(
        argv, "settled:", ratios, page
    )


CHECKS = (
    Check(
        ("bench/adaptive_bench.py",),
        "adaptive:",
        ("knee_err", "converge_s", "throughput_ratio"),
        ROOT / "docs" / "concepts" / "saturation.md",
    ),
    Check(
        ("bench/policy_suite.py",),
        "policy:",
        (
            "workloads",
            "tiers_at_or_above",
            "total_ratio_min",
            "total_ratio_mean",
            "wasted_tokens",
            "tpot_slo_violations",
            "hopeless_tokens",
            "preemptions",
        ),
        ROOT / "docs" / "concepts" / "slo-limits.md",
    ),
    Check(
        ("bench/policy_suite.py",),
        "settled:",
        ("tiers_at_or_above", "total_ratio_min", "total_ratio_mean", "unsettled"),
        ROOT / "docs" / "concepts" / "slo-limits.md",
    ),
    *_suite_lines("--seeds", "4"),
    *_suite_lines("--held-out"),
    *_suite_lines("--random", "60"),
    *_suite_lines("--random", "60", "--random-seed", "2"),
    Check(
        ("bench/tpot_limit_convergence.py",),
        "tpot_limit:",
        ("known_after_s", "samples", "before_step", "after_step", "settled_s"),
        ROOT / "docs" / "concepts" / "slo-limits.md",
    ),
    Check(
        ("bench/prefill_lag.py",),
        "prefill_lag:",
        (
            "lag_max_tokens",
            "lag_max_at_s",
            "lag_at_window_end",
            "batch_by_bound_prio",
            "batch_by_bound_gateway",
        ),
        ROOT / "docs" / "concepts" / "slo-limits.md",
    ),
    Check(
        ("bench/planner_validate.py",),
        "planner:",
        ("conv_err", "code_err", "prefix_err", "spec_err"),
        ROOT / "docs" / "planner.md",
    ),
)


def tokens(output: str, prefix: str) -> dict[str, str]:
    """The ``key=value`` tokens of the last line of ``output`` that starts with ``prefix``."""
    lines = [ln for ln in output.splitlines() if ln.startswith(prefix)]
    if not lines:
        return {}
    pairs = (t.partition("=") for t in lines[-1][len(prefix) :].split() if "=" in t)
    return {k: v for k, _, v in pairs}


def stale(check: Check, output: str, page: str) -> list[str]:
    """The ``key=value`` figures ``check``'s output has and its page's text does not quote."""
    got = tokens(output, check.prefix)
    wanted = [f"{k}={got.get(k, '<missing>')}" for k in check.keys]
    return [w for w in wanted if w not in page]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.readme_figures", description=__doc__)
    ap.add_argument("--list", action="store_true", help="print the checks, run nothing")
    args = ap.parse_args(argv)
    bad = 0
    runs: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = {}  # one run per command
    for check in CHECKS:
        command = " ".join(check.argv)
        where = check.page.relative_to(ROOT)
        if args.list:
            print(f"{command}: {check.prefix} {' '.join(check.keys)} (in {where})")
            continue
        proc = runs.get(check.argv)
        if proc is None:
            proc = runs[check.argv] = subprocess.run(
                [sys.executable, *check.argv], cwd=ROOT, capture_output=True, text=True, check=False
            )
        page = check.page.read_text(encoding="utf-8")
        missing = stale(check, proc.stdout, page) if proc.returncode == 0 else ["exit"]
        bad += bool(missing)
        verdict = "ok" if not missing else f"stale in {where}: " + ", ".join(missing)
        print(f"{command}: {verdict}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
