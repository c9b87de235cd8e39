"""Reports and the offline-fit CLI path of ``velvetrope calibrate --from-table``.

:func:`render_fit` formats a :class:`~velvetrope.engine.fit_published.TableFit` (the
coefficients before and after, the fit quality per source and per metric, the worst rows);
:func:`fitted_yaml` writes the profile with a comment block saying where its numbers came
from; :func:`run_table_fit` is what the command line calls.  Text only, no I/O but the
table file the caller names.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from velvetrope.engine.fit_published import (
    METRICS,
    TableFit,
    fit_profile,
    mape,
    summary_line,
)
from velvetrope.engine.profile import COEFFICIENTS, EngineProfile, load_profile, profile_to_yaml
from velvetrope.engine.published import PublishedPoint, load_table, read_default_table
from velvetrope.engine.replay import Prediction
from velvetrope.errors import PolicyError, VelvetropeError

__all__ = [
    "fitted_yaml",
    "parse_fixed",
    "render_fit",
    "render_predictions",
    "run_table_fit",
    "table_fit_command",
]


def parse_fixed(items: Sequence[str]) -> dict[str, float]:
    """``["per_context_token_s=8.8e-8", ...]`` -> ``{"per_context_token_s": 8.8e-08}``."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise PolicyError(f"--fix expects NAME=SECONDS, got {item!r}")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise PolicyError(f"--fix {key.strip()}: not a number: {value!r}") from None
    return out


def render_predictions(
    predictions: Sequence[Prediction],
    worst: int = 8,
    heldout: Sequence[Prediction] | None = None,
) -> str:
    """MAPE per source and metric (fitted, and held out when ``heldout`` is given), then the
    ``worst`` rows, then the E2E line when a row is an E2E latency, then the ``fidelity:``
    line (:func:`~velvetrope.engine.fit_published.summary_line`)."""
    header = "  ".join(f"{k + '_mape':>9}" for k in METRICS)
    lines = [f"{'source':<20} {'':<8} {'rows':>5}  {header}"]
    for label, group in (("fitted", predictions), ("held out", heldout or ())):
        by_source: dict[str, list[Prediction]] = defaultdict(list)
        for p in group:
            by_source[p.point.source].append(p)
        for source, preds in sorted(by_source.items()):
            m = mape(preds)
            cells = "  ".join(f"{m[k]:>9.3f}" if m[k] == m[k] else f"{'-':>9}" for k in METRICS)
            lines.append(f"{source:<20} {label:<8} {len(preds):>5}  {cells}")
    lines.append("worst rows (model vs published):")
    for p in sorted(predictions, key=lambda q: -abs(q.rel_error))[:worst]:
        flag = " (approx)" if p.point.approx else ""
        lines.append(
            f"  {p.point.id:<46} {p.point.metric:<10} {p.value:>10.4g} vs "
            f"{p.point.value:<10.4g} {p.rel_error:+.1%}{flag}"
        )
    e2e = [p for p in predictions if p.point.metric == "e2e"]
    if e2e:
        held_e2e = [p for p in heldout or () if p.point.metric == "e2e"]
        line = f"e2e: points={len(e2e)} e2e_mape={mape(e2e)['e2e']:.3f}"
        if held_e2e:
            line += f" heldout_points={len(held_e2e)} heldout_e2e_mape={mape(held_e2e)['e2e']:.3f}"
        lines.append(line)
    lines.append(summary_line(predictions, heldout))
    return "\n".join(lines) + "\n"


def render_fit(fit: TableFit) -> str:
    """The human-readable report of an offline fit."""
    buf = io.StringIO()
    buf.write(f"fitted profile {fit.profile.name!r} from {len(fit.predictions)} published rows\n")
    buf.write(f"{'coefficient':<22} {'before':>11} {'fitted':>11}\n")
    for name in (*COEFFICIENTS, "max_num_seqs"):
        before, after = getattr(fit.base, name), getattr(fit.profile, name)
        buf.write(f"{name:<22} {before:>11.4g} {after:>11.4g}\n")
    state = "converged" if fit.converged else "stopped at the replay limit"
    buf.write(f"{fit.replays} replays, {state}\n")
    buf.write(render_predictions(fit.predictions))
    return buf.getvalue()


def fitted_yaml(fit: TableFit, table: str, fixed: Mapping[str, float]) -> str:
    """The profile YAML preceded by a comment block: table, date, fit quality, fixed terms."""
    m = fit.mape
    sources = sorted({p.point.source for p in fit.predictions})
    lines = [
        f"# fitted by `velvetrope calibrate --from-table` on {datetime.now(UTC):%Y-%m-%d}",
        f"# table: {table} ({len(fit.predictions)} rows; sources: {', '.join(sources)})",
        f"# MAPE throughput {m['throughput']:.3f}, TTFT {m['ttft']:.3f}, TPOT {m['tpot']:.3f}",
    ]
    if fixed:
        lines.append("# not fitted (given): " + ", ".join(f"{k}={v:g}" for k, v in fixed.items()))
    return "\n".join(lines) + "\n" + profile_to_yaml(fit.profile)


def run_table_fit(
    table: str,
    profile: str,
    *,
    base: str | None = None,
    fixed: Mapping[str, float] | None = None,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[TableFit, str, str]:
    """Fit ``profile``'s rows of ``table`` (a path, or ``builtin``); returns the fit, the
    profile YAML and the report.  ``base`` (default: ``profile``) gives the starting point
    and everything not fitted."""
    points: list[PublishedPoint] = read_default_table() if table == "builtin" else load_table(table)
    rows = [p for p in points if p.profile == profile]
    if not rows:
        names = ", ".join(sorted({p.profile for p in points}))
        raise PolicyError(f"no rows of profile {profile!r} in {table} (it has: {names})")
    start: EngineProfile = load_profile(base or profile)
    fit = fit_profile(rows, start, name=name, fixed=fixed, progress=progress)
    return fit, fitted_yaml(fit, table, fixed or {}), render_fit(fit)


def table_fit_command(
    table: str | None,
    profile: str | None,
    fix: Sequence[str],
    out: Path | None,
    name: str | None,
    progress: Callable[[str], None],
) -> None:
    """``velvetrope calibrate --from-table``: fit offline, print or write the YAML.

    Like the live path: the YAML goes to ``out`` (the report to stdout) or, without it, to
    stdout (the report to stderr).  Exits 2 with a one-line message on any error.
    """
    import typer

    if table is None or profile is None:
        typer.echo(
            "velvetrope calibrate: error: give --url, or --from-table with --profile", err=True
        )
        raise typer.Exit(2)
    try:
        _, text, report = run_table_fit(
            table, profile, fixed=parse_fixed(fix), name=name, progress=progress
        )
        if out is not None:
            out.write_text(text, encoding="utf-8")
    except (VelvetropeError, OSError) as exc:
        typer.echo(f"velvetrope calibrate: error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(report, err=out is None, nl=False)
    typer.echo(text if out is None else f"wrote {out}", nl=out is not None)
