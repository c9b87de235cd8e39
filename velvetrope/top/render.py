"""Drawing one frame of ``velvetrope top`` with rich, within a given width and height.

:func:`render` turns a :class:`~velvetrope.top.model.View` into a renderable of at most
``height`` lines (``None``: every row) that fits ``width`` columns (80×24 over a plain SSH
terminal included).  From top to bottom: a title line with the totals, the gateways (one
row each, their shared state), the pools, the bands beside the outcomes per second, the
tenants beside the other buckets, the budgets (their burn), the engines, and a line of
keys.  Side by side needs
:data:`PAIR_WIDTH` columns; narrower, the pairs are stacked.

**Height.**  When the rows do not fit, :func:`allot` shares the lines between the tables:
each keeps its header and at least one row while the height allows (else the last tables
are left out), then the lines left are dealt one at a time to the tables that want more,
top first.  A table showing fewer rows than it has says so in its header (``TENANT +5``:
five more not shown).

**Width.**  :func:`fit` drops a table's columns by their rank
(:class:`~velvetrope.top.sections.Col`) until the rest fit at their natural width; the
first column is then cut with an ellipsis if it must.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from velvetrope.top.controls import Controls
from velvetrope.top.model import View
from velvetrope.top.sections import Cell, Section, compact, sections

__all__ = ["PAIR_WIDTH", "allot", "fit", "render"]

PAIR_WIDTH = 76
"""The narrowest width at which two tables stand side by side."""
_GAP = 2
"""Spaces between two columns (a cell's padding of one on each side)."""


def allot(wants: Sequence[int], lines: int) -> list[int]:
    """Rows for each table (``wants[i]`` rows, each table also costing a header line)
    within ``lines``: see the module docstring.  A table left out, or wanting none, gets 0."""
    wanted = [i for i, w in enumerate(wants) if w > 0]
    while wanted and 2 * len(wanted) > lines:
        wanted.pop()
    got = [0] * len(wants)
    for i in wanted:
        got[i] = 1
    left = lines - 2 * len(wanted)
    while left > 0:
        dealt = False
        for i in wanted:
            if left > 0 and got[i] < wants[i]:
                got[i] += 1
                left -= 1
                dealt = True
        if not dealt:
            break
    return got


def _len(c: Cell) -> int:
    return cell_len(c.plain if isinstance(c, Text) else c)


def fit(section: Section, width: int) -> Section:
    """``section`` without the columns it must drop to fit ``width`` (highest rank
    first, the rightmost of a rank first); columns of rank 0 are always kept."""
    cols, rows = list(section.cols), [list(r) for r in section.rows]

    def natural() -> int:
        widths = [max([cell_len(c.head), *(_len(r[i]) for r in rows)]) for i, c in enumerate(cols)]
        return sum(widths) + _GAP * (len(cols) - 1)

    while natural() > width:
        ranked = [(c.drop, i) for i, c in enumerate(cols) if c.drop > 0]
        if not ranked:
            break
        _, i = max(ranked)
        del cols[i]
        for r in rows:
            del r[i]
    return Section(cols, rows)


def _table(section: Section, rows: int, width: int) -> Table:
    cols, body = fit(section, width)
    t = Table(box=None, padding=(0, 1), pad_edge=False, show_edge=False, header_style="bold")
    for i, c in enumerate(cols):
        head = c.head if i or rows >= len(body) else f"{c.head} +{len(body) - rows}"
        t.add_column(
            head,
            justify="left" if c.justify == "left" else "right",
            no_wrap=True,
            overflow="ellipsis",
        )
    for r in body[:rows]:
        t.add_row(*r)
    return t


def _rate(v: float | None) -> str:
    return compact(v, 1) if v is None or abs(v) < 100 else compact(v)


def _title(view: View, clock: str) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("top", "bold")
    if clock:
        t.append(f" {clock}")
    up = view.up
    n = len(view.replicas)
    t.append(f"  up {up}/{n}", "green" if up == n else "bold red")
    t.append(f"  queued {compact(view.queued)}  flight {compact(view.in_flight)}")
    t.append(f"  in {_rate(view.arrived_per_s)}/s  admit {_rate(view.admitted_per_s)}/s")
    t.append(f"  rej {_rate(view.rejected_per_s)}/s")
    return t


def _footer(c: Controls) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis", style="reverse")
    if c.editing:
        t.append(f"filter: {c.filter}_   Enter keep  Esc clear")
        return t
    order = "▲" if c.reverse else "▼"
    t.append(f"s sort:{c.sort}{order}  r reverse  / filter")
    if c.filter:
        t.append(f" [{c.filter}]  Esc clear")
    t.append("  q quit")
    return t


def render(
    view: View, width: int, height: int | None, clock: str = "", keys: bool = False
) -> RenderableType:
    """The frame of ``view`` in ``width`` columns and at most ``height`` lines (``None``:
    every row; see the module docstring).  ``clock``: a time of day for the title;
    ``keys``: end with the line of keys (and the filter being typed)."""
    gateways, pools, first, second, budgets, engines = sections(view)
    layout: list[tuple[Section, ...]] = [(gateways,), (pools,)]
    for pair in (first, second):
        present = tuple(s for s in pair if s.rows)
        if width >= PAIR_WIDTH and len(present) == 2:
            layout.append(present)
        else:
            layout += [(s,) for s in present]
    layout += [(budgets,), (engines,)]
    layout = [g for g in layout if any(s.rows for s in g)]  # the gateways: a row each at least
    wants = [max(len(s.rows) for s in g) for g in layout]
    got = wants if height is None else allot(wants, max(0, height - 1 - keys))
    parts: list[RenderableType] = [_title(view, clock)]
    half = (width - _GAP // 2) // 2
    for group, rows in zip(layout, got, strict=True):
        if rows == 0:
            continue
        if len(group) == 1:
            parts.append(_table(group[0], rows, width))
            continue
        grid = Table.grid(padding=(0, _GAP // 2))
        grid.add_column(width=half, no_wrap=True)
        grid.add_column(width=width - _GAP // 2 - half, no_wrap=True)
        grid.add_row(_table(group[0], rows, half), _table(group[1], rows, width - 1 - half))
        parts.append(grid)
    if keys:
        parts.append(_footer(view.controls))
    return Group(*parts)
