"""``top``'s frame: within the width and height, every figure where the view puts it."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console

from tests.top.samples import sample, status
from velvetrope.top import Controls, Sample, View, build_view
from velvetrope.top.render import PAIR_WIDTH, allot, fit, render
from velvetrope.top.sections import Col, Section, bar, compact

GW = "http://gw-a:8080"


def frame(view: View, width: int, height: int | None, keys: bool = False) -> list[str]:
    """The frame as plain lines, right spaces stripped."""
    console = Console(width=width, color_system=None, force_terminal=False, record=True)
    console.print(render(view, width, height, "12:00:00", keys))
    return [line.rstrip() for line in console.export_text().splitlines()]


def memory(controls: Controls | None = None) -> View:
    return build_view(
        [sample("memory-1-gw0", GW, 1.0)], {GW: sample("memory-0-gw0", GW, 0.0)}, controls
    )


def fleet() -> View:
    urls = ["http://gw-a:8080", "http://gw-b:8080"]
    return build_view(
        [
            *(sample(f"redis-1-gw{j}", u, 1.0) for j, u in enumerate(urls)),
            Sample("http://gw-c:8080", 1.0, None, None, "unreachable"),
        ],
        {u: sample(f"redis-0-gw{j}", u, 0.0) for j, u in enumerate(urls)},
    )


def cells(lines: list[str], first: str) -> list[str]:
    """The cells (split on runs of two spaces or more) of the line starting with ``first``."""
    (line,) = [ln for ln in lines if ln.startswith(first)]
    return [c.strip() for c in line.split("  ") if c.strip()]


def test_allot_gives_every_row_when_there_is_room() -> None:
    assert allot([1, 3, 2], 20) == [1, 3, 2]
    assert allot([1, 3, 2], 9) == [1, 3, 2]


def test_allot_deals_rows_top_first_and_keeps_a_row_each() -> None:
    assert allot([1, 5, 5], 8) == [1, 2, 2]  # 3 headers, then 1+1+1, then 1 and 1
    assert allot([1, 5, 5], 7) == [1, 2, 1]
    assert allot([4, 0, 4], 6) == [2, 0, 2]


def test_allot_leaves_out_the_last_tables_when_too_short() -> None:
    assert allot([2, 2, 2], 5) == [2, 1, 0]
    assert allot([2, 2, 2], 1) == [0, 0, 0]


def test_fit_drops_the_highest_ranks_first_and_never_rank_zero() -> None:
    sec = Section(
        [Col("NAME", "left"), Col("A", drop=1), Col("B", drop=2), Col("C")],
        [["x" * 10, "1" * 5, "2" * 5, "3" * 5]],
    )
    assert [c.head for c in fit(sec, 40).cols] == ["NAME", "A", "B", "C"]  # 10+5+5+5+6
    assert [c.head for c in fit(sec, 30).cols] == ["NAME", "A", "C"]
    assert [c.head for c in fit(sec, 23).cols] == ["NAME", "C"]
    assert fit(sec, 23).rows == [["x" * 10, "3" * 5]]
    assert [c.head for c in fit(sec, 5).cols] == ["NAME", "C"]


def test_numbers_are_abbreviated() -> None:
    assert [compact(v) for v in (None, 0, 9999, 10_000, 12_345, 999_999, 4_100_000, 2e9)] == [
        "-",
        "0",
        "9999",
        "10.0k",
        "12.3k",
        "1000k",
        "4.1M",
        "2.0G",
    ]
    assert compact(2.25, 1) == "2.2"
    assert bar(3, 4, 8) == "██████··"
    assert bar(9, 4, 4) == "████"
    assert bar(1, 0) == ""


def test_the_memory_gateway_at_80x24_shows_the_status_figures() -> None:
    st = status("memory-1-gw0")
    lines = frame(memory(), 80, 24, keys=True)
    assert len(lines) <= 24
    assert max(cell_len(line) for line in lines) <= 80
    pool = st["pools"]["default"]
    assert cells(lines, "default")[:4] == [
        "default",
        str(pool["queued"]),
        f"{pool['queued_tokens'] / pool['drain_tokens_per_s']:.0f}s",
        f"████████ {pool['in_flight']}/{pool['max_in_flight']}",
    ]
    for band, b in pool["bands"].items():
        assert cells(lines, band)[1] == str(b["queued"])
    assert cells(lines, "bronze")[:6] == ["bronze", "6", "200k", "100%", "2.6", "21%"]
    assert cells(lines, "bronze")[6:] == ["0.0", "8.0"]  # completions, rejections per second
    assert "rejected queue_full  8.0     37" in "\n".join(lines)
    dead = next(u["url"] for u in st["upstreams"] if not u["healthy"])
    assert cells(lines, dead.removeprefix("http://"))[2:4] == ["down", "closed"]
    assert lines[0].startswith("top 12:00:00  up 1/1  queued 32  flight 4  in 18.0/s")
    assert lines[-1].startswith("s sort:queued▼")


def test_the_fleet_shows_each_gateway_and_its_shared_state() -> None:
    lines = frame(fleet(), 80, 24)
    assert max(cell_len(line) for line in lines) <= 80
    assert cells(lines, "gw-a:8080") == [
        "gw-a:8080",
        "up",
        "26",
        "3",
        "redis up",
        "2",
        "47",
        "0",
        "0",
    ]
    assert cells(lines, "gw-c:8080") == ["gw-c:8080", "down", "unreachable"]
    assert cells(lines, "default")[3] == "████████ 4/4+2"  # 4 slots held of 4, 2 waiting
    assert "up 2/3" in lines[0]


def test_a_short_terminal_truncates_and_says_how_many_rows_are_hidden() -> None:
    lines = frame(memory(), 80, 14, keys=True)
    assert len(lines) == 14
    heads = [line.split("  ")[0] for line in lines]
    # 12 lines for 5 tables: a header and a row each, then one more row for each of the
    # first two tables that want more (bands and outcomes, tenants)
    assert [h for h in heads if "+" in h] == ["BAND +1", "TENANT +1", "ENGINE +2"]
    assert lines[-1].startswith("s sort")
    full = frame(memory(), 80, None)
    assert len(full) == 1 + 2 + 2 + 4 + 4 + 4  # title, gateways, pools, bands, tenants, engines


def test_a_narrow_terminal_stacks_the_pairs_and_drops_columns() -> None:
    for width in (PAIR_WIDTH - 1, 60, 50):
        lines = frame(fleet(), width, 24, keys=True)
        assert max(cell_len(line) for line in lines) <= width, width
        assert len(lines) <= 24
    wide = frame(memory(), PAIR_WIDTH, None)
    narrow = frame(memory(), PAIR_WIDTH - 1, None)
    assert any(line.startswith("BAND") and "OUTCOME" in line for line in wide)
    assert not any(line.startswith("BAND") and "OUTCOME" in line for line in narrow)
    assert any(line.startswith("OUTCOME") for line in narrow)


def test_the_filter_shows_in_the_keys_line() -> None:
    typing = frame(memory(Controls(filter="bro", editing=True)), 80, 24, keys=True)
    assert typing[-1].startswith("filter: bro_")
    kept = frame(memory(Controls(filter="bro", sort="bucket", reverse=True)), 80, 24, keys=True)
    assert kept[-1].startswith("s sort:bucket▲  r reverse  / filter [bro]")
    assert [ln.split()[0] for ln in kept if ln.split()[0] in {"bronze", "gold", "silver"}] == [
        "bronze"
    ]


def test_budget_burn_shows_used_of_limit_share_and_reset() -> None:
    st = status("memory-1-gw0")
    st["budgets"] = [
        {"key": "quota:acme:day:2026-12-07:tok", "scope": "acme", "window": "day",
         "unit": "tok", "used": 250.0, "limit": 1000.0, "reset_s": 7200.0},
        {"key": "quota:globex:rolling6h:usd", "scope": "globex", "window": "rolling6h",
         "unit": "usd", "used": 61.0, "limit": 50.0, "reset_s": None},
    ]  # fmt: skip
    view = build_view([Sample(GW, 1.0, st, None)], {})
    lines = frame(view, 120, None)
    assert cells(lines, "BUDGET") == ["BUDGET", "WINDOW", "USED", "USED%", "RESET"]
    assert cells(lines, "acme") == [
        "acme",
        "day",
        f"{bar(250, 1000, 10)} 250/1000",
        "25%",
        "120m",
    ]
    assert cells(lines, "globex") == [
        "globex", "rolling6h", f"{bar(61, 50, 10)} $61.0/$50.0", "122%", "rolling",
    ]  # fmt: skip
