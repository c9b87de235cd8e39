"""``docs/design.md`` checks itself (issue 42, item 4): the walk it writes is the one a real
streamed chat completion with Redis state takes through the gateway's code, and its layout
lists the package's modules as they are on disk.  A stale document fails here; ``python -m
harness.design_walk --write`` writes the walk again.

How the walk is recorded (:mod:`harness.walk_record`): in a process of its own, with
``sys.setprofile``, the gateway imported from its ``.py`` sources.  mypyc's compiled modules
(``setup.py``'s ``COMPILED``) emit no profile events, and ``VELVETROPE_PURE=1`` only decides
what an install builds, so the recorder puts a finder first on ``sys.meta_path`` that loads
every ``velvetrope`` module from its source, and refuses to report if an extension was loaded
all the same: the compiled modules are built from those sources (``velvetrope/fresh.py``
refuses a stale build), so the calls are theirs.  The request is real: a ``redis-server``
(the suite's), a ``velvetrope engine --instant`` started here, the official ``openai`` client
streaming into the gateway's ASGI app through ``httpx2.ASGITransport`` (the ``httpx`` that
``openai`` is built on).  The walk keeps each distinct cross-module call once, in the order
it first happened (``harness.design_walk``'s docstring), which keeps it the same from run to
run: a call in a loop (the stream's chunks, however they arrive) counts once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.design_walk import (
    DESIGN,
    Stats,
    documented_walk,
    layout_problems,
    listed_layout,
    record_walk,
    walk_lines,
    walk_stats,
    with_walk,
)
from harness.walk_record import Call


def test_the_counts_are_taken_on_the_walk_each_call_once() -> None:
    calls: list[Call] = [
        ("a", "f", "b", "g"),
        ("b", "g", "c", "h"),
        ("a", "f", "b", "g"),  # the same call again (a loop): once
        ("a", "f", "c", "k"),  # back into c: a revisit
        ("c", "k", "a", "x"),  # back into a, where the walk began: a revisit
    ]
    assert walk_lines(calls) == ["a:f -> b:g", "b:g -> c:h", "a:f -> c:k", "c:k -> a:x"]
    stats = walk_stats(calls)
    assert stats == Stats(calls=4, modules=3, revisits=2)
    assert stats.line() == "walk: calls=4 modules=3 revisits=2"


def test_the_walk_is_written_in_place_of_the_old_one() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    assert with_walk(text, documented_walk(text)) == text
    rewritten = with_walk(text, ["x:f -> y:g"])
    assert documented_walk(rewritten) == ["x:f -> y:g"]
    assert rewritten.replace("x:f -> y:g\n", "") == text.replace(
        "".join(line + "\n" for line in documented_walk(text)), ""
    )


def test_the_layout_lists_every_module_and_only_modules_that_exist() -> None:
    assert layout_problems(DESIGN.read_text(encoding="utf-8")) == []


def test_a_layout_that_misses_or_invents_a_module_is_stale(tmp_path: Path) -> None:
    package = tmp_path / "velvetrope"
    for path in ("__init__.py", "clock.py", "core/__init__.py", "core/job.py", "core/lua/a.lua"):
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text("")
    (package / "core" / "bucket.py").write_text("")
    text = "\n".join(
        [
            "## Package layout",
            "",
            "```",
            "velvetrope/",
            "  clock.py          the clock",
            "  core/             sans-IO admission",
            "    job.py, heap.py the job, and a module that is gone",
            "                    bucket.py (a description's word, not an entry)",
            "    lua/            scripts",
            "    data/           a directory that is gone",
            "deploy/             not the package",
            "  bucket.py         not the package either",
            "```",
        ]
    )
    modules, directories = listed_layout(text)
    assert modules == {"clock.py", "core/job.py", "core/heap.py"}
    assert directories == {"core", "core/lua", "core/data"}
    assert layout_problems(text, package) == [
        "not in the layout: velvetrope/core/bucket.py",
        "listed, no such module: velvetrope/core/heap.py",
        "listed, no such directory: velvetrope/core/data/",
    ]


@pytest.mark.integration
def test_the_documented_walk_is_the_walk_of_a_streamed_request_with_redis_state(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = record_walk(redis_url)
    with capsys.disabled():
        print(f"\n{walk_stats(calls).line()}")
    walk = walk_lines(calls)
    # the request went through Redis, and its stream's first token through the ticket
    assert any(line.split(" -> ")[1].startswith("store.redis_store:") for line in walk)
    assert "gateway.upstream.relay:_credit -> gateway.driver.admission:Ticket.first_token" in walk
    assert documented_walk(DESIGN.read_text(encoding="utf-8")) == walk, (
        "docs/design.md's walk is stale: `python -m harness.design_walk --write` writes it"
    )
