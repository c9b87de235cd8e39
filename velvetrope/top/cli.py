"""``velvetrope top``: the command line of the live view (:mod:`velvetrope.top`)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

__all__ = ["top_command"]


def top_command(
    url: Annotated[
        list[str],
        typer.Option(
            "--url",
            "-u",
            help="A gateway's base URL (http:// if no scheme); repeat it for several replicas.",
        ),
    ],
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="VELVETROPE_ADMIN_TOKEN",
            help="Bearer token of /admin/status (the config's admin_token).",
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option(help="Seconds between polls (with --once: between its two).")
    ] = 1.0,
    once: Annotated[
        bool,
        typer.Option(
            help="Print one frame (rates over one interval) and exit: 1 if a gateway is down."
        ),
    ] = False,
) -> None:
    """Live view of a running gateway or its replicas, from /admin/status and /metrics.

    Queues by pool, band and tenant; outcomes per second by reason; buckets;
    in flight against each pool's limit; engine readings and breakers; Redis.
    Keys: s sort, r reverse, / filter (tenant or pool), Esc clear, q quit.
    """
    if interval < 0 or (interval == 0 and not once) or interval != interval:
        raise typer.BadParameter("must be > 0 (or 0 with --once)", param_hint="--interval")
    from velvetrope.top.poll import normalize_url
    from velvetrope.top.run import run_top

    urls = list(dict.fromkeys(normalize_url(u) for u in url))
    try:
        code = asyncio.run(run_top(urls, admin_token, interval, once))
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
