"""``docs/design.md`` checked against the code: the request's walk and the package layout.

**The walk.** :mod:`harness.walk_record` records, in a process of its own, the cross-module
calls of one streamed chat completion with Redis state (a real ``redis-server``, a real
``velvetrope engine --instant``, the gateway in process; its docstring says how and why
from the sources).  The walk is that record with each distinct call kept once, where it
first happened (``caller -> callee``, a module and a function on each side), as a reader of
the code would count a call site in a loop: the stream's chunks, a loop over quantiles, the
header lookups, each once.  Nothing else is left out: the calls into ``openai/`` (the
request's validation, the SSE reading) and the metrics are the request's path as much as
the core's are, and they are as stable.  ``docs/design.md`` holds it in the ``text`` block
below the :data:`WALK_MARK` line; the counts, on the same walk:

* ``calls``: its length, N;
* ``modules``: the distinct modules it goes through (callers and callees), M;
* ``revisits``: its calls whose callee's module was already on the walk before (as a caller
  or a callee), R.  Every call enters a new module or revisits one: N = (M - 1) + R when
  every module but the first is entered by a call.

The engine answers at once (``--instant``), so the stream reaches the gateway in one read:
a stream that arrives in pieces would add the relay's send to the client once.

**The layout.** The first fenced block under ``## Package layout`` lists the package: one
entry a line, ``name/`` for a package or directory and ``name.py`` (several: ``a.py, b.py``)
for modules, indented two spaces a level below ``velvetrope/``; lines indented
:data:`DESCRIPTION_COLUMN` or more continue a description.  Every ``velvetrope/**/*.py`` but
``__init__.py`` (its package's line stands for it) must be listed, and every listed module or
directory must exist.

Run::

    python -m harness.design_walk          # record, print the counts; exit 1 when stale
    python -m harness.design_walk --write  # record, write the walk into docs/design.md
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.walk_record import Call

__all__ = [
    "DESCRIPTION_COLUMN",
    "DESIGN",
    "WALK_MARK",
    "Stats",
    "documented_walk",
    "layout_problems",
    "listed_layout",
    "main",
    "record_walk",
    "walk_lines",
    "walk_stats",
    "with_walk",
]

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
PACKAGE = ROOT / "velvetrope"
WALK_MARK = "<!-- walk: written by python -m harness.design_walk --write -->"
LAYOUT_HEADING = "## Package layout"
DESCRIPTION_COLUMN = 12
"""Layout lines indented this far or more continue a description (entries are above)."""
_RECORDER = (sys.executable, "-m", "harness.walk_record")
_FENCE = re.compile(r"^```")
_ENTRY = re.compile(r"(?P<names>[a-z0-9_]+(?:/|\.py)(?:, [a-z0-9_]+\.py)*)(?=\s|$)")


@dataclass(frozen=True)
class Stats:
    """The walk's counts (see the module docstring)."""

    calls: int
    modules: int
    revisits: int

    def line(self) -> str:
        return f"walk: calls={self.calls} modules={self.modules} revisits={self.revisits}"


def _walk(calls: list[Call]) -> list[Call]:
    seen: set[Call] = set()
    out: list[Call] = []
    for call in calls:
        if call not in seen:
            seen.add(call)
            out.append(call)
    return out


def walk_lines(calls: list[Call]) -> list[str]:
    """The walk as ``docs/design.md`` writes it: ``module:function -> module:function``."""
    return [f"{cm}:{cf} -> {em}:{ef}" for cm, cf, em, ef in _walk(calls)]


def walk_stats(calls: list[Call]) -> Stats:
    """N, M and R of the walk of ``calls``."""
    walk = _walk(calls)
    visited: set[str] = set()
    revisits = 0
    for caller, _, callee, _ in walk:
        visited.add(caller)
        revisits += callee in visited
        visited.add(callee)
    return Stats(len(walk), len(visited), revisits)


def _block_after(lines: list[str], start: int) -> tuple[int, int]:
    """``(first, end)``: the lines of the first fenced block at or after ``start``."""
    for i in range(start, len(lines)):
        if _FENCE.match(lines[i]):
            for j in range(i + 1, len(lines)):
                if _FENCE.match(lines[j]):
                    return i + 1, j
            break
    raise ValueError(f"no fenced block after line {start + 1} of {DESIGN.name}")


def _walk_block(lines: list[str]) -> tuple[int, int]:
    if WALK_MARK not in lines:
        raise ValueError(f"{DESIGN.name} has no walk: no line {WALK_MARK!r}")
    return _block_after(lines, lines.index(WALK_MARK) + 1)


def documented_walk(text: str) -> list[str]:
    """The walk ``text`` (``docs/design.md``) holds under :data:`WALK_MARK`."""
    lines = text.splitlines()
    first, end = _walk_block(lines)
    return lines[first:end]


def with_walk(text: str, walk: list[str]) -> str:
    """``text`` with the block under :data:`WALK_MARK` replaced by ``walk``."""
    lines = text.splitlines()
    first, end = _walk_block(lines)
    return "\n".join([*lines[:first], *walk, *lines[end:]]) + "\n"


def listed_layout(text: str) -> tuple[set[str], set[str]]:
    """``(modules, directories)`` the layout block of ``text`` lists under ``velvetrope/``,
    as paths relative to the package (``core/job.py``, ``core``)."""
    lines = text.splitlines()
    first, end = _block_after(lines, lines.index(LAYOUT_HEADING))
    modules: set[str] = set()
    directories: set[str] = set()
    stack: list[str] = []  # the directories above the current line, velvetrope/ first
    for line in lines[first:end]:
        indent = len(line) - len(line.lstrip(" "))
        m = _ENTRY.match(line, indent)
        if indent >= DESCRIPTION_COLUMN or m is None:
            continue
        depth = indent // 2
        if depth == 0:
            stack = [m["names"]] if m["names"] == "velvetrope/" else []
            continue
        if not stack or depth > len(stack):
            continue  # outside velvetrope/, or a description's word at an entry's indent
        del stack[depth:]
        prefix = "".join(stack[1:])
        names = m["names"].split(", ")
        if names[0].endswith("/"):
            directories.add(prefix + names[0].rstrip("/"))
            stack.append(names[0])
        else:
            modules.update(prefix + n for n in names)
    return modules, directories


def layout_problems(text: str, package: Path = PACKAGE) -> list[str]:
    """What the layout of ``text`` gets wrong about ``package`` on disk (empty: nothing)."""
    modules, directories = listed_layout(text)
    on_disk = {
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    packages = {p.parent.relative_to(package).as_posix() for p in package.rglob("*/__init__.py")}
    problems = [f"not in the layout: velvetrope/{m}" for m in sorted(on_disk - modules)]
    problems += [
        f"package not in the layout: velvetrope/{d}/" for d in sorted(packages - directories)
    ]
    problems += [f"listed, no such module: velvetrope/{m}" for m in sorted(modules - on_disk)]
    problems += [
        f"listed, no such directory: velvetrope/{d}/"
        for d in sorted(directories)
        if not (package / d).is_dir()
    ]
    return problems


def record_walk(redis_url: str | None = None) -> list[Call]:
    """The calls :mod:`harness.walk_record` records, against a ``velvetrope engine
    --instant`` started here and ``redis_url`` (a ``redis-server`` started here if None);
    both stopped before returning."""
    from tests.support.redis_server import RedisServer
    from velvetrope.serving.launch import start_engine

    server = None
    if redis_url is None:
        server = RedisServer()
        server.start()
        redis_url = server.url
    try:
        with start_engine("--instant") as engine:
            out = subprocess.run(
                [*_RECORDER, "--redis", redis_url, "--engine", engine.url],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
    finally:
        if server is not None:
            server.stop()
    if out.returncode != 0:
        raise RuntimeError(f"harness.walk_record failed ({out.returncode}):\n{out.stderr}")
    return [(a, b, c, d) for a, b, c, d in json.loads(out.stdout)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the walk into docs/design.md")
    args = ap.parse_args(argv)
    calls = record_walk()
    print(walk_stats(calls).line())
    text = DESIGN.read_text(encoding="utf-8")
    walk = walk_lines(calls)
    if args.write:
        DESIGN.write_text(with_walk(text, walk), encoding="utf-8")
        print(f"wrote the walk ({len(walk)} calls) into {DESIGN.relative_to(ROOT)}")
    stale = documented_walk(DESIGN.read_text(encoding="utf-8")) != walk
    if stale:
        diff = difflib.unified_diff(documented_walk(text), walk, "docs", "recorded", lineterm="")
        print("\n".join(diff))
    problems = layout_problems(DESIGN.read_text(encoding="utf-8"))
    print("\n".join(problems) or "layout: every module listed, every listed one exists")
    sys.exit(1 if stale or problems else 0)


if __name__ == "__main__":
    main()
