"""``velvetrope usage``: print a gateway's usage ledger (``GET /admin/usage``)."""

from __future__ import annotations

from typing import Annotated, Literal

import httpx
import orjson
import typer

from velvetrope.gateway.ops.usage import CSV_COLUMNS

__all__ = ["usage_command"]


def usage_command(
    url: Annotated[
        str, typer.Option("--url", "-u", help="A gateway's base URL (http:// if no scheme).")
    ],
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="VELVETROPE_ADMIN_TOKEN",
            help="Bearer token of /admin (the config's admin_token).",
        ),
    ] = None,
    first: Annotated[
        str | None, typer.Option("--from", help="First day, YYYY-MM-DD (inclusive).")
    ] = None,
    last: Annotated[
        str | None, typer.Option("--to", help="Last day, YYYY-MM-DD (inclusive).")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="One tenant's rows only.")] = None,
    output: Annotated[
        Literal["table", "csv", "json"],
        typer.Option("--format", help="table (aligned columns), csv or json, as the endpoint."),
    ] = "table",
) -> None:
    """Print the usage ledger of a gateway (or of the fleet sharing its Redis): one row
    per tenant, model and day, with requests, tokens and cost.  Exits 1 when the gateway
    refuses or cannot be reached."""
    base = url if "://" in url else f"http://{url}"
    params = {k: v for k, v in (("from", first), ("to", last), ("tenant", tenant)) if v}
    params["format"] = "csv" if output == "csv" else "json"
    headers = {"authorization": f"Bearer {admin_token}"} if admin_token else {}
    try:
        r = httpx.get(base.rstrip("/") + "/admin/usage", params=params, headers=headers)
    except httpx.HTTPError as e:
        typer.echo(f"velvetrope usage: {base}: {e}", err=True)
        raise typer.Exit(1) from e
    if r.status_code != 200:
        typer.echo(f"velvetrope usage: {r.status_code}: {r.text}", err=True)
        raise typer.Exit(1)
    if output != "table":
        typer.echo(r.text, nl=not r.text.endswith("\n"))
        return
    rows = [[str(row[c] if row[c] is not None else "") for c in CSV_COLUMNS]
            for row in orjson.loads(r.content)["rows"]]  # fmt: skip
    for row in rows:
        row[-1] = f"{float(row[-1]):.6f}"
    table = [list(CSV_COLUMNS), *rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(CSV_COLUMNS))]
    for line in table:
        cells = zip(line, widths, strict=True)
        typer.echo("  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(cells)))
