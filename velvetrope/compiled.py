"""Is this install's admission core compiled?  The image build's check (``deploy/Dockerfile``).

``setup.py`` compiles the modules of its ``COMPILED`` list with mypyc, and installs plain
Python when the compile fails (no C compiler, no headers): correct, only slower, and silent.
An image must not ship that by accident, so its build runs::

    python -P -m velvetrope.compiled setup.py

which exits 1, naming them, when any module of the list is not a compiled extension in the
installed package, and 0 (printing the count) when all are.  A module is checked by
importing it and reading its ``__file__`` (an extension module's ends in a suffix of
:data:`importlib.machinery.EXTENSION_SUFFIXES`), except under :data:`NEEDS_EXTRA`: packages
whose ``__init__`` needs an optional extra (``velvetrope.sim`` needs ``[sim]``), which a base
install cannot import; there the extension file is looked for next to the package instead.
``-P`` keeps the current directory (a source tree, plain ``.py`` files) off ``sys.path``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import sys
from pathlib import Path

__all__ = ["NEEDS_EXTRA", "compiled_modules", "main", "not_compiled"]

NEEDS_EXTRA = ("velvetrope.sim",)
"""Packages whose modules are checked on disk, not imported (their ``__init__`` needs an
extra; see :mod:`velvetrope.extras`)."""


def compiled_modules(setup_py: Path) -> list[str]:
    """The dotted module names of ``setup.py``'s ``COMPILED`` list (read, not executed)."""
    tree = ast.parse(setup_py.read_text(), str(setup_py))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "COMPILED"
            and isinstance(node.value, ast.List)
        ):
            paths = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            return [str(p).removesuffix(".py").replace("/", ".") for p in paths]
    raise ValueError(f"{setup_py}: no COMPILED = [...] list")


def _is_extension(path: str | None) -> bool:
    return path is not None and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def not_compiled(modules: list[str]) -> list[str]:
    """The modules of ``modules`` that are not compiled extensions in this install."""
    import velvetrope

    root = Path(velvetrope.__file__).resolve().parent.parent
    out = []
    for name in modules:
        if name.startswith(tuple(p + "." for p in NEEDS_EXTRA)):
            base = root.joinpath(*name.split("."))
            ok = any(
                base.with_name(base.name + s).exists()
                for s in importlib.machinery.EXTENSION_SUFFIXES
            )
        else:
            ok = _is_extension(importlib.import_module(name).__file__)
        if not ok:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m velvetrope.compiled SETUP_PY``: 0 when every listed module is compiled."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -P -m velvetrope.compiled path/to/setup.py", file=sys.stderr)
        return 2
    modules = compiled_modules(Path(args[0]))
    pure = not_compiled(modules)
    if not modules or pure:
        print(f"not compiled ({len(pure)} of {len(modules)}): {', '.join(pure)}", file=sys.stderr)
        return 1
    print(f"velvetrope: {len(modules)} compiled modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
