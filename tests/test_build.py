"""The compiled modules build on a fresh machine.

``setup.py`` compiles its list with mypyc inside pip's isolated build environment, which
holds only ``[build-system] requires``.  mypy type-checks every module the compiled ones
reach through imports, and the package ``__init__`` of each, and fails the install on an
import it cannot resolve; a source checkout's ``.mypy_cache`` hides such a failure.  So
every package those modules reach must be installed in the build environment, or be one the
mypy configuration lets go unresolved.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from tests.test_structure import closure, externals, modules
from velvetrope.compiled import compiled_modules as compiled_list

ROOT = Path(__file__).resolve().parents[1]

PROVIDED_WITH = {
    "mypy": {"mypy", "mypy_extensions", "typing_extensions"},
    "pydantic": {"pydantic", "pydantic_core", "annotated_types", "typing_extensions"},
    "pyyaml": {"yaml"},  # types-PyYAML: the stubs of the package imported as yaml
}
"""The import names a build requirement provides, where they are not its own name (a stubs
package's, or those of its dependencies)."""


def compiled_modules() -> list[str]:
    """The dotted names of ``setup.py``'s ``COMPILED`` list (read, not imported)."""
    return compiled_list(ROOT / "setup.py")


def build_environment() -> set[str]:
    """The top-level import names the isolated build environment has."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    names: set[str] = set()
    for req in config["build-system"]["requires"]:
        dist = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower()
        name = dist.removeprefix("types-").replace("-", "_")
        names |= PROVIDED_WITH.get(name, {name})
    return names


def unresolved_allowed() -> set[str]:
    """Top-level packages the mypy configuration lets go unresolved."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    out: set[str] = set()
    for override in config["tool"]["mypy"].get("overrides", []):
        if override.get("ignore_missing_imports"):
            out |= {m.split(".")[0] for m in override["module"]}
    return out


def type_checked(start: list[str]) -> set[str]:
    """Our modules mypy checks when it compiles ``start``: what they reach through imports,
    with every package on the way to each (its ``__init__``), and what those reach."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += closure(m) - seen
        parts = m.split(".")
        todo += [p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) not in seen]
    return seen


def unresolvable(checked: set[str], available: set[str]) -> set[tuple[str, str]]:
    """``(package, module)``: each import of a package outside ``available``."""
    return {(name, m) for m in checked for name in externals()[m] if name not in available}


def available() -> set[str]:
    """What the build's type check resolves: the standard library, the build environment
    and what the mypy configuration lets go unresolved."""
    return set(sys.stdlib_module_names) | build_environment() | unresolved_allowed()


def test_the_compiled_list_names_modules_of_ours() -> None:
    compiled = compiled_modules()
    assert "velvetrope.core.controller" in compiled and "velvetrope.sim.runner" in compiled
    assert set(compiled) <= set(modules())


def test_what_the_compiled_modules_reach_is_in_the_build_environment() -> None:
    checked = type_checked(compiled_modules())
    assert "velvetrope.sim" in checked  # a compiled module's package __init__ counts
    missing = unresolvable(checked, available())
    assert not missing, (
        "the isolated build cannot resolve these imports (add the package to "
        f"[build-system] requires): {sorted(missing)}"
    )


def test_the_check_sees_a_missing_requirement() -> None:
    """Without rich (the simulator's sweep and report import it) the simulator's loop
    would not build: the check says so."""
    checked = type_checked(["velvetrope.sim.runner"])
    missing = unresolvable(checked, available() - {"rich"})
    assert ("rich", "velvetrope.sim.sweep") in missing
    assert {name for name, _ in missing} == {"rich"}
