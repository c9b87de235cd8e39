"""The tables of ``velvetrope top``'s frame, as cells: one :data:`Section` per table.

Each builder turns rows of the :class:`~velvetrope.top.model.View` into formatted cells
(numbers abbreviated by :func:`compact`, times in seconds, fills in per cent) and its
columns, each with the rank at which it is dropped when the width is short
(:func:`velvetrope.top.render.fit`; 0: never).  The first column names the row.
"""

from __future__ import annotations

from typing import NamedTuple

from rich.text import Text

from velvetrope.top.model import View
from velvetrope.top.rows import EngineRow, ReplicaRow

__all__ = ["Cell", "Col", "Section", "bar", "compact", "sections"]

Cell = str | Text

_BREAKER_STYLE = {"closed": "green", "half_open": "yellow"}


class Col(NamedTuple):
    """A column: its header, ``"left"`` or ``"right"``, and its drop rank (0: kept)."""

    head: str
    justify: str = "right"
    drop: int = 0


class Section(NamedTuple):
    """A table: its columns and its rows of cells, in the order shown."""

    cols: list[Col]
    rows: list[list[Cell]]


def bar(n: float, full: float, width: int = 24) -> str:
    """``n`` of ``full`` as a bar of ``width`` cells (``█`` filled, ``·`` empty); ``""``
    when ``full`` is not positive."""
    if full <= 0:
        return ""
    k = max(0, min(width, round(width * n / full)))
    return "█" * k + "·" * (width - k)


def compact(v: float | None, digits: int = 0) -> str:
    """``v`` in a few characters: ``-`` for ``None``; under 10,000 with ``digits``
    decimals; above, in thousands (``k``), millions (``M``) or billions (``G``), with one
    decimal under 100 of them (``12.3k``, ``450k``)."""
    if v is None:
        return "-"
    a = abs(v)
    if a < 10_000:
        return f"{v:.{digits}f}"
    scale, unit = (1e9, "G") if a >= 1e9 else (1e6, "M") if a >= 1e6 else (1e3, "k")
    x = v / scale
    return f"{x:.1f}{unit}" if abs(x) < 100 else f"{x:.0f}{unit}"


def _small(v: float | None) -> str:
    """A rate or a bucket level: one decimal under 100."""
    return compact(v, 1) if v is None or abs(v) < 100 else compact(v)


def _secs(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 10:
        return f"{v:.2f}s"
    return f"{v:.0f}s" if v < 600 else f"{v / 60:.0f}m"


def _pct(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if abs(v) < 0.1 else f"{100 * v:.0f}%"


def _host(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def _replicas(rows: list[ReplicaRow]) -> Section:
    redis = any(r.backend == "redis" for r in rows)
    body: list[list[Cell]] = []
    for r in rows:
        extra: list[Cell] = []
        if not r.up:
            extra = [""] * 4 if redis else []
            # a 401 is a live gateway that will not show its status without the token
            alive = Text("401", "bold yellow") if r.denied else Text("down", "bold red")
            down: list[Cell] = [_host(r.url), alive, "", ""]
            down.append(Text(r.error or "", "red"))
            body.append([*down, *extra])
            continue
        up = Text("drain", "yellow") if r.draining else Text("up", "green")
        state = Text(r.backend or "-")
        if r.backend == "redis":
            state.append(" up" if r.state_up else " DOWN", "green" if r.state_up else "bold red")
            if r.breaker and r.breaker != "closed":
                state.append(f" {r.breaker}", "bold red")
            extra = [compact(r.replicas), compact(r.fleet_queued), compact(r.outbox)]
            extra.append(compact(r.fallbacks))
        if r.error:
            state.append(f" {r.error}", "yellow")
        body.append([_host(r.url), up, compact(r.queued), compact(r.in_flight), state, *extra])
    cols = [Col("GATEWAY", "left"), Col("UP", "left"), Col("QUEUED"), Col("FLIGHT")]
    cols.append(Col("STATE", "left"))
    if redis:
        cols += [Col("REPL"), Col("FLEET Q", drop=2), Col("OUTBOX", drop=3)]
        cols.append(Col("FALLBK", drop=1))
    return Section(cols, body)


def _pools(view: View) -> Section:
    body: list[list[Cell]] = []
    for p in view.pools:
        limit = "-" if p.max_in_flight is None else compact(p.max_in_flight)
        if p.held is None:
            flight = f"{bar(p.in_flight, p.max_in_flight or 0, 8)} {p.in_flight}/{limit}"
        else:  # leases held across the replicas, and the jobs dispatched here still waiting for one
            flight = f"{bar(p.held, p.max_in_flight or 0, 8)} {p.held}/{limit}"
            if p.in_flight > p.held:
                flight += f"+{p.in_flight - p.held}"
        toks = f"{compact(p.tokens_in_flight)}/{compact(p.max_tokens_in_flight)}"
        wait = _secs(p.predicted_wait_s)
        drain = compact(p.drain_tokens_per_s)
        body.append([p.name, compact(p.queued), wait, flight, toks, drain, str(p.engines)])
    cols = [Col("POOL", "left"), Col("QUEUED"), Col("WAIT~"), Col("IN FLIGHT", "left")]
    return Section([*cols, Col("TOKENS", drop=2), Col("DRAIN/s", drop=1), Col("ENG", drop=3)], body)


def _bands(view: View) -> Section:
    body: list[list[Cell]] = [
        [b.name, compact(b.queued), compact(b.tokens), _secs(b.wait_s)] for b in view.bands
    ]
    return Section([Col("BAND", "left"), Col("QUEUED"), Col("TOKENS", drop=1), Col("WAIT")], body)


def _outcomes(view: View) -> Section:
    body: list[list[Cell]] = []
    for o in view.outcomes:
        what = o.outcome if o.reason in (o.outcome, "") else f"{o.outcome} {o.reason}"
        style = "red" if o.outcome == "rejected" else ""
        body.append([Text(what, style), _small(o.per_s), compact(o.total)])
    for e in view.endpoints:  # the same requests by endpoint kind
        body.append([Text(f"endpoint {e.outcome}", "dim"), _small(e.per_s), compact(e.total)])
    return Section([Col("OUTCOME", "left"), Col("/s"), Col("TOTAL", drop=1)], body)


def _tenants(view: View) -> Section:
    rates = view.tenant_rates
    body: list[list[Cell]] = []
    for t in view.tenants:
        row: list[Cell] = [t.name, compact(t.queued)]
        row += [_small(t.tokens), _pct(t.tokens_fill), _small(t.requests), _pct(t.requests_fill)]
        if rates:
            row += [_small(t.done_per_s), _small(t.rejected_per_s)]
        body.append(row)
    cols = [Col("TENANT", "left"), Col("QUEUED"), Col("TOK", drop=2), Col("TOK%")]
    cols += [Col("REQ", drop=3), Col("REQ%", drop=1)]
    if rates:
        cols += [Col("OK/s", drop=4), Col("REJ/s")]
    return Section(cols, body)


def _buckets(view: View) -> Section:
    body: list[list[Cell]] = [[b.key, _small(b.level), _pct(b.fill)] for b in view.buckets]
    return Section([Col("BUCKET", "left"), Col("LEVEL", drop=1), Col("FILL")], body)


def _budgets(view: View) -> Section:
    """Budget burn: used of each budget's limit, as a bar and a share, and its reset."""
    body: list[list[Cell]] = []
    for b in view.budgets:
        unit = "$" if b.unit == "usd" else ""
        used = f"{bar(b.used, b.limit, 10)} {unit}{_small(b.used)}/{unit}{_small(b.limit)}"
        share = b.share
        style = "bold red" if share is not None and share >= 1 else ""
        reset = "rolling" if b.reset_s is None else _secs(b.reset_s)
        body.append([b.scope, b.window, used, Text(_pct(share), style), reset])
    cols = [Col("BUDGET", "left"), Col("WINDOW", "left"), Col("USED", "left", 2)]
    return Section([*cols, Col("USED%"), Col("RESET", drop=1)], body)


def _engine(e: EngineRow) -> list[Cell]:
    health = Text("ok", "green") if e.healthy else Text("down", "bold red")
    brk = Text(e.breaker.replace("half_open", "half"), _BREAKER_STYLE.get(e.breaker, "bold red"))
    gw = str(e.gateway_in_flight)
    reading = [compact(e.running), compact(e.waiting), _pct(e.kv_usage), _secs(e.age_s)]
    return [_host(e.url), e.pool, health, brk, gw, *reading]


def _engines(view: View) -> Section:
    cols = [
        Col("ENGINE", "left"),
        Col("POOL", "left", 2),
        Col("UP", "left"),
        Col("BREAKER", "left"),
    ]
    cols += [Col("GW", drop=1), Col("RUN"), Col("WAIT"), Col("KV"), Col("AGE")]
    return Section(cols, [_engine(e) for e in view.engines])


def sections(
    view: View,
) -> tuple[Section, Section, tuple[Section, Section], tuple[Section, Section], Section, Section]:
    """The frame's tables from top to bottom: gateways, pools, (bands, outcomes),
    (tenants, other buckets), budgets, engines."""
    return (
        _replicas(view.replicas),
        _pools(view),
        (_bands(view), _outcomes(view)),
        (_tenants(view), _buckets(view)),
        _budgets(view),
        _engines(view),
    )
