"""The package's shape, checked from the source text: sizes, import cycles, layering.

Every ``import`` and ``from ... import`` statement of every module under ``velvetrope/``
counts, wherever it stands: at the top, inside a function (a lazy import), under ``if
TYPE_CHECKING:`` or in a ``try``.  Each becomes an edge of a graph between modules:

* ``import a.b.c`` is an edge to ``a.b.c`` (to the longest prefix that is one of our
  modules, if ``a.b.c`` is a name inside one);
* ``from a.b import x`` is an edge to ``a.b.x`` when that is a module (a submodule
  imported by name), else to ``a.b`` (a name defined by ``a.b``, or by its package
  ``__init__``); relative imports are resolved first;
* a package is its ``__init__``.  Importing ``a.b.c`` is *not* counted as an edge to the
  ``a`` and ``a.b`` packages, although Python runs their ``__init__`` first: a package that
  re-exports its submodules (an edge from the ``__init__`` to each) would otherwise be a
  cycle with every one of them.  What is counted is what a module names: a submodule that
  takes a name from its own package's ``__init__`` (``from velvetrope.core import Job``
  inside ``velvetrope/core/``) closes a real cycle and is reported.

The graph must have no cycle.  On top of it: no module over :data:`MAX_LINES` lines; the
admission core depends on none of the packages above it (the direction of
``docs/design.md``); only the HTTP homes import an HTTP library, and what is sans-IO (the
core, the OpenAI protocol, the engine model and calibration's fitting, the simulator, the
planner, ``top``'s view model and drawing) does not reach one, nor asyncio, sockets or
Redis, through anything it imports.
The design the code cites is that file, in the repository.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "velvetrope"
MAX_LINES = 500
DESIGN = ROOT.parent / "docs" / "design.md"
"""The architecture, as the code cites it."""

HTTP_LIBS = frozenset({"aiohttp", "httpx", "uvicorn", "uvloop", "httptools"})
HTTP_HOMES = (
    "velvetrope.gateway",
    "velvetrope.engine.serve",
    "velvetrope.engine.calibrate.client",
    "velvetrope.serving",
    "velvetrope.demo",
    "velvetrope.top.poll",
)
"""Where an HTTP client or server may be used (a module, or a package and everything in it)."""
SANS_IO = (
    "velvetrope.core",
    "velvetrope.openai",
    "velvetrope.engine",
    "velvetrope.sim",
    "velvetrope.planner",
    "velvetrope.top.controls",
    "velvetrope.top.exposition",
    "velvetrope.top.model",
    "velvetrope.top.render",
    "velvetrope.top.rows",
    "velvetrope.top.sections",
)
"""Packages (or modules) whose modules must not reach an HTTP library or asyncio, except below
:data:`SANS_IO_EXCEPT` (the engine's HTTP side and the commands that start it)."""
SANS_IO_EXCEPT = (
    "velvetrope.engine.serve",
    "velvetrope.engine.calibrate.client",
    "velvetrope.engine.calibrate.cli",
)
CORE_MUST_NOT_REACH = ("gateway", "sim", "engine", "planner", "openai", "store")


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    return {_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _ours(name: str) -> str | None:
    """The module ``name`` refers to: itself, or the longest prefix that is one of ours."""
    mods = modules()
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported(module: str) -> Iterator[str]:
    """Every dotted name ``module`` imports, anywhere in its body (see the module doc)."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            for a in node.names:
                full = f"{base}.{a.name}"
                yield full if full in modules() else base


@cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the modules of ours it imports."""
    out: dict[str, frozenset[str]] = {}
    for m in modules():
        targets = {_ours(n) for n in _imported(m)}
        out[m] = frozenset(t for t in targets if t is not None and t != m)
    return out


@cache
def externals() -> dict[str, frozenset[str]]:
    """Module -> the top-level names of other packages it imports (``aiohttp``, ``os``...)."""
    return {
        m: frozenset(n.split(".")[0] for n in _imported(m) if not n.startswith("velvetrope"))
        for m in modules()
    }


def closure(module: str) -> set[str]:
    """``module`` and every module of ours it reaches through imports."""
    seen = {module}
    todo = [module]
    while todo:
        for t in graph()[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def cycles(g: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of ``g`` with more than one module, or a module
    importing itself (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(g):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp: list[str] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in g[v]:
                    found.append(sorted(comp))
    return found


def _path(a: str, b: str) -> list[str]:
    """A shortest import path from ``a`` to ``b`` (both in the graph), for messages."""
    prev: dict[str, str] = {}
    todo = [a]
    while todo:
        nxt: list[str] = []
        for v in todo:
            for w in sorted(graph()[v]):
                if w not in prev and w != a:
                    prev[w] = v
                    nxt.append(w)
        todo = nxt
    out = [b]
    while out[-1] != a:
        out.append(prev[out[-1]])
    return out[::-1]


# -- the checks ------------------------------------------------------------------------------


def test_the_graph_sees_every_kind_of_import() -> None:
    g = graph()
    # a lazy import inside a function (the command line registers demo lazily)
    assert "velvetrope.demo" in g["velvetrope.cli"]
    # a package __init__ re-exporting its submodules
    assert "velvetrope.core.controller" in g["velvetrope.core"]
    # ``from package import submodule``
    assert "velvetrope.serving.launch" in g["velvetrope.demo.run"]
    # a name taken from a package __init__ is an edge to that __init__
    assert "velvetrope.engine" in g["velvetrope.sim.capacity"]
    assert "aiohttp" in externals()["velvetrope.engine.calibrate.client"]


def test_cycle_detection_finds_what_it_should() -> None:
    g = {
        "a": frozenset({"b"}),
        "b": frozenset({"c"}),
        "c": frozenset({"a"}),
        "d": frozenset({"a", "d"}),
        "e": frozenset(),
    }
    assert sorted(cycles(g)) == [["a", "b", "c"], ["d"]]
    assert cycles({"x": frozenset({"y"}), "y": frozenset()}) == []


def test_no_import_cycle_between_modules() -> None:
    found = cycles(graph())
    assert not found, "import cycles (lazy imports included): " + "; ".join(
        " -> ".join([*_path(c[0], c[-1]), *_path(c[-1], c[0])[1:]]) for c in found
    )


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_is_over_the_line_limit(module: str) -> None:
    n = len(modules()[module].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{modules()[module]} has {n} lines (at most {MAX_LINES})"


def test_the_core_depends_on_nothing_above_it() -> None:
    banned = tuple(f"velvetrope.{p}" for p in CORE_MUST_NOT_REACH)
    bad = {
        m: sorted(t for t in closure(m) if _within(t, banned))
        for m in modules()
        if _within(m, ["velvetrope.core"])
    }
    bad = {m: ts for m, ts in bad.items() if ts}
    assert not bad, {m: " -> ".join(_path(m, ts[0])) for m, ts in bad.items()}


def test_only_the_http_homes_import_an_http_library() -> None:
    users = {m: sorted(externals()[m] & HTTP_LIBS) for m in modules()}
    bad = {m: libs for m, libs in users.items() if libs and not _within(m, HTTP_HOMES)}
    assert not bad, f"HTTP libraries outside {HTTP_HOMES}: {bad}"


def test_sans_io_code_reaches_no_http_library_asyncio_or_redis() -> None:
    forbidden = HTTP_LIBS | {"asyncio", "socket", "redis"}
    bad: dict[str, str] = {}
    for m in modules():
        if not _within(m, SANS_IO) or _within(m, SANS_IO_EXCEPT):
            continue
        for t in sorted(closure(m)):
            hit = externals()[t] & forbidden
            if hit:
                bad[m] = f"{' -> '.join(_path(m, t) if t != m else [m])} imports {sorted(hit)}"
                break
    assert not bad, bad


def test_the_design_the_code_cites_is_in_the_repository() -> None:
    """Sources cite ``docs/design.md``, which exists, never the upper-case design file that
    lived outside the repository."""
    assert DESIGN.is_file(), DESIGN
    outside = "DESIGN" + ".md"  # spelled apart so this file does not cite it
    base = ROOT.parent
    sources = [base / "README.md"]
    sources += sorted(p for d in ("velvetrope", "tests", "bench") for p in (base / d).rglob("*.py"))
    cited = [
        f"{p.relative_to(base)}:{n}"
        for p in sources
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if outside in line
    ]
    assert not cited, f"cite docs/design.md instead of {outside}: {cited}"
