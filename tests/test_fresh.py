"""velvetrope refuses compiled modules older than their sources."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from velvetrope.fresh import COMPILED_PACKAGES, refuse_stale_builds, stale_builds

EXT = "cpython-311-x86_64-linux-gnu.so"


def test_a_source_edited_after_its_build_is_reported(tmp_path: Path) -> None:
    for name, source_t, ext_t in (("fresh", 100, 200), ("stale", 300, 200), ("same", 200, 200)):
        (tmp_path / f"{name}.py").write_text("x = 1\n")
        (tmp_path / f"{name}.{EXT}").write_bytes(b"\\x7fELF")
        os.utime(tmp_path / f"{name}.py", (source_t, source_t))
        os.utime(tmp_path / f"{name}.{EXT}", (ext_t, ext_t))
    (tmp_path / f"orphan.{EXT}").write_bytes(b"")  # no source: nothing to compare
    assert stale_builds(tmp_path) == [(tmp_path / "stale.py", tmp_path / f"stale.{EXT}")]


def test_only_a_source_checkout_is_refused(tmp_path: Path) -> None:
    for root, checkout in ((tmp_path / "repo", True), (tmp_path / "site-packages", False)):
        pkg = root / "velvetrope" / "core"
        pkg.mkdir(parents=True)
        if checkout:
            (root / "setup.py").write_text("")
        (pkg / f"bucket.{EXT}").write_bytes(b"")
        (pkg / "bucket.py").write_text("x = 1\n")
        os.utime(pkg / f"bucket.{EXT}", (100, 100))
        if checkout:
            with pytest.raises(ImportError, match="make install"):
                refuse_stale_builds(pkg)
        else:
            refuse_stale_builds(pkg)  # installed: files written in any order, not checked


def test_the_modules_setup_lists_are_compiled_all_or_none() -> None:
    """``make install`` compiled every module setup.py lists, or (VELVETROPE_PURE=1, or no C
    compiler on the machine) none of them: never a mix.  Nothing else is compiled."""
    import importlib

    root = Path(__file__).resolve().parents[1]
    listed = re.findall(r'"(velvetrope/\w+/\w+)\.py"', (root / "setup.py").read_text())
    assert len(listed) >= 10
    kinds = {
        Path(str(importlib.import_module(p.replace("/", ".")).__file__)).suffix for p in listed
    }
    assert kinds in ({".so"}, {".py"}), kinds
    if os.environ.get("VELVETROPE_PURE") == "1":
        assert kinds == {".py"}
    assert str(importlib.import_module("velvetrope.core.policy").__file__).endswith(".py")
    # every package holding a listed module is checked for stale builds on import
    assert {"/".join(p.split("/")[1:-1]) for p in listed} <= set(COMPILED_PACKAGES)
