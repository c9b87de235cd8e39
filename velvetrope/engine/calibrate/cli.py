"""``velvetrope calibrate``: fit an engine profile to a live OpenAI-compatible endpoint
(or, with ``--from-table``, offline to published benchmark results).

Registered in :mod:`velvetrope.cli` as ``app.command("calibrate")(calibrate_command)``.
The sweep and the fit are :mod:`velvetrope.engine.calibrate`'s (imported lazily, so that
the rest of the command line does not pay for aiohttp).

Output: the profile YAML goes to ``--out`` (or, without it, to stdout); the report (a
table of fitted coefficients with their standard errors and, with ``--compare``, a
reference profile's values and the relative errors, then the fit quality) goes to stdout
when ``--out`` is given, else to stderr, so ``velvetrope calibrate ... > my.yaml`` works.
Exit codes: 0 on success, 2 on any error (endpoint down, bad answers, bad options), with
a one-line message on stderr.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from velvetrope.errors import VelvetropeError

__all__ = ["calibrate_command"]


def calibrate_command(
    url: Annotated[
        str | None,
        typer.Option(help="Base URL of the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000"),
    ] = None,
    from_table: Annotated[
        str | None,
        typer.Option(
            help="Fit offline to a published-results table (CSV; 'builtin' for the shipped "
            "one) instead of measuring an endpoint."
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(help="With --from-table: the profile whose rows are fitted (and the start)."),
    ] = None,
    fix: Annotated[
        list[str] | None,
        typer.Option(help="With --from-table: keep a coefficient at a value, NAME=SECONDS."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model to request (default: the first of /v1/models).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Bearer token for the endpoint, if it needs one.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write the profile YAML here (default: stdout).")
    ] = None,
    base_profile: Annotated[
        str,
        typer.Option(
            help="Profile (name or YAML) whose KV-cache and scheduler limits are kept and "
            "size the sweep."
        ),
    ] = "llama3-8b-h100",
    speed_hint: Annotated[
        float,
        typer.Option(
            help="K of a `velvetrope engine --speed K` endpoint (wall seconds x K = model "
            "seconds); 1 for a real engine."
        ),
    ] = 1.0,
    quick: Annotated[
        bool, typer.Option(help="A short sweep (about a third of the full one's time).")
    ] = False,
    compare: Annotated[
        str | None,
        typer.Option(help="Reference profile (name or YAML) to compare the fit with."),
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(min=1, help="Repeats of every probe (default 3).")
    ] = None,
    max_seconds: Annotated[
        float, typer.Option(help="Start no probe after this many seconds (wall).")
    ] = 600.0,
    timeout: Annotated[
        float, typer.Option(help="Seconds a stream may stay silent before failing.")
    ] = 120.0,
    name: Annotated[
        str | None, typer.Option(help="Name of the written profile (default: from the model).")
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Tokens one request may use (prompt + output).  Default: what the endpoint "
            "says (vLLM's max_model_len, llama.cpp's n_ctx per slot), else the base profile's.",
        ),
    ] = None,
    slots: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Requests the engine runs at once.  Default: what the endpoint says "
            "(llama.cpp's total_slots), else the base profile's max_num_seqs.",
        ),
    ] = None,
) -> None:
    """Measure an OpenAI-compatible endpoint and fit an engine profile to it.

    Streams a bounded sweep of /v1/completions (prompt lengths, output lengths, concurrency).

    Times every chunk on the client side and fits the four step-time coefficients.

    Writes the profile YAML (stdout, or --out) with the fit quality in its comments.

    Run it against an otherwise idle engine.  Exits 2 on any error.

    With --from-table FILE --profile NAME it fits NAME's rows of a published-results table
    offline instead (velvetrope.engine.fit_published).
    """
    from velvetrope.engine.calibrate.client import CalibrationSettings, calibrate
    from velvetrope.engine.calibrate.report import calibrated_yaml, render_report
    from velvetrope.engine.profile import load_profile

    def progress(msg: str) -> None:
        typer.echo(msg, err=True)

    if from_table is not None or url is None:
        from velvetrope.engine.fit_report import table_fit_command

        table_fit_command(from_table, profile, fix or [], out, name, progress)
        return

    try:
        reference = load_profile(compare) if compare is not None else None
        settings = CalibrationSettings(
            url=url,
            model=model,
            api_key=api_key,
            base_profile=base_profile,
            speed_hint=speed_hint,
            quick=quick,
            repeats=repeats,
            max_seconds=max_seconds,
            request_timeout_s=timeout,
            name=name,
            max_model_len=max_model_len,
            slots=slots,
        )
        result = asyncio.run(calibrate(settings, progress))
        text = calibrated_yaml(result)
        if out is not None:
            try:
                out.write_text(text, encoding="utf-8")
            except OSError as exc:
                typer.echo(f"velvetrope calibrate: error: cannot write {out}: {exc}", err=True)
                raise typer.Exit(2) from None
    except VelvetropeError as exc:
        typer.echo(f"velvetrope calibrate: error: {exc}", err=True)
        raise typer.Exit(2) from None
    report = render_report(result, reference)
    if out is None:
        typer.echo(report, err=True, nl=False)
        typer.echo(text, nl=False)
    else:
        typer.echo(report, nl=False)
        typer.echo(f"wrote {out}")
