"""``harness.llama_build``: where llama-server is kept, and that a cached one is never built
again.  The build itself (pip fetches the sdist, cmake compiles llama-server) runs in
``make llama-server`` and before ``tests/engines/``; here a file in a temporary cache stands
for the binary, so a call that tried to fetch or build would fail at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import llama_build
from harness.llama_build import LLAMA_CPP_PYTHON_VERSION, binary_path, cache_dir


def test_the_cache_is_the_environments_or_the_users(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VELVETROPE_LLAMA_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    assert binary_path() == tmp_path / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}"
    monkeypatch.delenv("VELVETROPE_LLAMA_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "velvetrope" / "llama"


def test_a_cached_binary_is_returned_without_a_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_build(*args: object) -> None:
        raise AssertionError("built although cached")

    monkeypatch.setattr(llama_build, "_build", no_build)
    cached = binary_path(tmp_path)
    cached.write_bytes(b"#!/bin/sh\n")
    assert llama_build.ensure_llama_server(tmp_path) == cached
    assert llama_build.main(["--cache", str(tmp_path)]) == 0


def test_a_failed_build_says_which_step_and_leaves_no_binary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing(target: Path, version: str, jobs: int, log: Path) -> None:
        raise llama_build.LlamaBuildError(f"cmake --build failed (exit 2); log: {log}")

    monkeypatch.setattr(llama_build, "_build", failing)
    assert llama_build.main(["--cache", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "cmake --build failed" in err and "build-" in err
    assert not binary_path(tmp_path).exists()
