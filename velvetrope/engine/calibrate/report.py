"""What a calibration produced (:class:`CalibrationResult`), and its two renderings.

:func:`calibrated_yaml` is the profile YAML with the sweep and the fit quality in its
comments; :func:`render_report` the human-readable table (vs a reference profile).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from velvetrope.engine.calibrate.fit import Fit, relative_errors
from velvetrope.engine.calibrate.observe import Observation, ProbeRun
from velvetrope.engine.calibrate.plan import Probe
from velvetrope.engine.profile import COEFFICIENTS, EngineProfile, profile_to_yaml

__all__ = ["CalibrationResult", "calibrated_yaml", "render_report"]


@dataclass(frozen=True)
class CalibrationResult:
    """The outcome of :func:`calibrate`: the profile, the fit and how it was measured."""

    profile: EngineProfile
    fit: Fit
    base: EngineProfile
    url: str
    model: str
    speed_hint: float
    plan: tuple[Probe, ...]
    runs: tuple[ProbeRun, ...]
    observations: tuple[Observation, ...]
    notes: tuple[str, ...]
    requests: int
    wall_seconds: float
    endpoint_max_model_len: int | None
    finished_at: str


def _fmt_probe_set(plan: Sequence[Probe]) -> list[str]:
    uniq = list(dict.fromkeys(plan))
    reps = len(plan) // max(1, len(uniq))
    singles = [p for p in uniq if p.kind == "single"]
    mixed = [p for p in uniq if p.kind == "mixed"]
    batches = [p for p in uniq if p.kind == "batch"]
    lines = [f"{len(uniq)} probes x {reps} repeats (interleaved):"]
    if singles:
        lines.append(
            f"  single: prompt {[p.prompt_tokens for p in singles]} tokens, "
            f"{singles[0].output_tokens} output tokens"
        )
    if mixed:
        lines.append(
            f"  mixed: host {mixed[0].prompt_tokens}+{mixed[0].output_tokens} tokens, guest "
            f"prompt {[p.guest_prompt_tokens for p in mixed]} tokens"
        )
    if batches:
        lines.append(
            "  batch (streams x prompt / output): "
            + ", ".join(f"{p.streams}x{p.prompt_tokens}/{p.output_tokens}" for p in batches)
        )
    return lines


def calibrated_yaml(result: CalibrationResult) -> str:
    """The profile YAML (:func:`~velvetrope.engine.profile.profile_to_yaml`) preceded by
    comments that state the endpoint, the sweep and the fit quality."""
    fit = result.fit
    b = result.base
    lines = [
        f"Calibrated by `velvetrope calibrate` at {result.finished_at}.",
        f"endpoint: {result.url}  model: {result.model}  speed hint K={result.speed_hint:g} "
        "(model seconds = measured wall seconds x K)",
        f"sweep: {result.requests} requests (one a discarded warm-up) in "
        f"{result.wall_seconds:.1f} s wall; " + "\n".join(_fmt_probe_set(result.plan)),
        f"fit: weighted least squares over {len(fit.rows)} rows (median of repeats, "
        "per-step normalised); client-side timings and usage only",
        f"  R^2 = {fit.r2:.6f}; relative residuals rms {fit.rms_rel_residual:.2%}, "
        f"max {fit.max_rel_residual:.2%} ({fit.worst_row})",
    ]
    for n in COEFFICIENTS:
        v, se = fit.coefficients[n], fit.stderr[n]
        rel = f"+/- {se / v:.1%}" if v > 0 and math.isfinite(se) else "(no error estimate)"
        lines.append(f"  {n:<20} = {v:.4g} {rel} (1 s.e.)")
    if fit.at_bound:
        lines.append(f"  at the non-negativity bound (not resolved): {', '.join(fit.at_bound)}")
    ctx = fit.coefficients["per_context_token_s"] * (b.max_model_len // 2)
    lines.append(
        f"  per_context_token_s x {b.max_model_len // 2} tokens = {ctx * 1e3:.3f} ms per "
        f"sequence-step (step_base_s = {fit.coefficients['step_base_s'] * 1e3:.3f} ms)"
    )
    if fit.overhead_s is not None:
        per_tok = (
            ""
            if fit.overhead_per_token_s is None
            else f" {fit.overhead_per_token_s / result.speed_hint * 1e6:+.3f} us per prompt token"
        )
        lines.append(
            f"  TTFT beyond the engine's steps (not in the profile): "
            f"{fit.overhead_s / result.speed_hint * 1e3:.2f} ms{per_tok} (wall)"
        )
    lines.append(
        f"KV-cache and scheduler limits (block_size .. max_model_len) are copied from the "
        f"base profile {b.name!r}, not measured"
        + (
            f"; the endpoint reports max_model_len {result.endpoint_max_model_len}"
            if result.endpoint_max_model_len not in (None, b.max_model_len)
            else ""
        )
    )
    lines.extend(f"note: {n}" for n in result.notes)
    comment = "".join(f"# {part}\n" for ln in lines for part in ln.splitlines() or [""])
    return comment + "#\n" + profile_to_yaml(result.profile)


def render_report(result: CalibrationResult, reference: EngineProfile | None) -> str:
    """The human-readable report: coefficients (vs ``reference``), fit quality, notes."""
    fit = result.fit
    table = Table(title=f"calibrated profile {result.profile.name!r}")
    table.add_column("coefficient")
    table.add_column("fitted", justify="right")
    table.add_column("± s.e.", justify="right")
    if reference is not None:
        table.add_column(f"reference ({reference.name})", justify="right")
        table.add_column("rel. error", justify="right")
    errs = relative_errors(result.profile, reference) if reference is not None else {}
    for n in COEFFICIENTS:
        v, se = fit.coefficients[n], fit.stderr[n]
        cells = [n, f"{v:.4g}", f"{se / v:.1%}" if v > 0 and math.isfinite(se) else "-"]
        if reference is not None:
            cells += [f"{getattr(reference, n):.4g}", f"{errs[n]:.2%}"]
        table.add_row(*cells)
    buf = io.StringIO()
    Console(file=buf, width=100, force_terminal=False, color_system=None).print(table)
    lines = [
        f"endpoint {result.url} model {result.model}: {result.requests} requests in "
        f"{result.wall_seconds:.1f} s (speed hint {result.speed_hint:g})",
        f"fit: R² {fit.r2:.6f} over {len(fit.rows)} rows; relative residuals rms "
        f"{fit.rms_rel_residual:.2%}, max {fit.max_rel_residual:.2%} ({fit.worst_row})",
    ]
    if fit.overhead_s is not None:
        lines.append(
            f"TTFT beyond the engine's steps: {fit.overhead_s / result.speed_hint * 1e3:.2f} ms"
            + (
                ""
                if fit.overhead_per_token_s is None
                else f" {fit.overhead_per_token_s / result.speed_hint * 1e6:+.3f} µs/token"
            )
            + " (wall, not part of the profile)"
        )
    if fit.at_bound:
        lines.append(f"not resolved (pinned at 0): {', '.join(fit.at_bound)}")
    if reference is not None:
        lines.append(f"max relative error: {max(errs.values()):.2%}")
    lines.extend(f"note: {n}" for n in result.notes)
    return buf.getvalue().rstrip() + "\n" + "\n".join(lines) + "\n"
