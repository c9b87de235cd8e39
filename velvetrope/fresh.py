"""Imported first by :mod:`velvetrope`: in a source checkout, refuses to run a module
compiled (by mypyc, see ``setup.py``'s list) from an older version of its source.  After an
edit, the extension next to the ``.py`` would otherwise run the old code, silently; ``make
install`` builds it again.
"""

from pathlib import Path

__all__ = ["COMPILED_PACKAGES", "refuse_stale_builds", "stale_builds"]

COMPILED_PACKAGES = (
    "core",
    "engine",
    "gateway/api",
    "gateway/driver",
    "gateway/upstream",
    "gateway/ops",
    "openai",
    "sim",
    "store",
)
"""The packages that hold modules ``setup.py`` compiles."""


def stale_builds(directory: Path) -> list[tuple[Path, Path]]:
    """``(source, extension)`` pairs in ``directory`` whose source is newer."""
    out = []
    for ext in sorted(directory.glob("*.so")):
        source = directory / (ext.name.split(".", 1)[0] + ".py")
        if source.exists() and source.stat().st_mtime > ext.stat().st_mtime:
            out.append((source, ext))
    return out


def refuse_stale_builds(directory: Path) -> None:
    """Raise ImportError if ``directory`` (a package of a source checkout: ``setup.py`` two
    or three levels up) holds a stale extension.  An installed package is not checked: its
    files are all written at install time, in no particular order."""
    if not any((up / "setup.py").exists() for up in directory.parents[1:3]):
        return
    stale = stale_builds(directory)
    if stale:
        source, ext = stale[0]
        raise ImportError(
            f"{source} changed after it was compiled to {ext.name}: run `make install` to "
            "build it again (or reinstall with VELVETROPE_PURE=1 for plain Python)"
        )


for _package in COMPILED_PACKAGES:
    refuse_stale_builds(Path(__file__).parent / _package)
