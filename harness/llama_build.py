"""Build llama.cpp's ``llama-server`` from the ``llama-cpp-python`` sdist and keep it cached.

``make llama-server`` runs this module; the engine tests (``tests/engines/``) and
``bench/real_engine_bench.py`` call :func:`ensure_llama_server` and so build it themselves on a
machine that has none.  Contract:

* the source is the llama.cpp vendored inside the ``llama-cpp-python`` sdist of
  :data:`LLAMA_CPP_PYTHON_VERSION`, fetched with pip from the configured index (no other
  download: the web UI is neither built nor fetched, no curl, no OpenSSL);
* only the ``llama-server`` target is built: CPU, Release, static libraries, ``-j`` from
  ``--jobs`` (2 by default, the machine's size);
* the result is one file, ``<cache>/llama-server-<version>``, where ``<cache>`` is
  ``$VELVETROPE_LLAMA_CACHE`` or ``~/.cache/velvetrope/llama`` (the Makefile passes its own);
  it is written under a temporary name and renamed, so a half-built binary is never found, and
  a build that another process is running is waited for (a lock file) instead of repeated;
* when the binary exists, nothing is fetched or built.

The first build takes minutes on two cores; after it, finding the binary costs nothing.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

__all__ = [
    "LLAMA_CPP_PYTHON_VERSION",
    "LlamaBuildError",
    "binary_path",
    "cache_dir",
    "ensure_llama_server",
    "main",
]

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The ``llama-cpp-python`` release whose vendored llama.cpp is built (pinned: a new release is
a deliberate change, and a new cache entry)."""

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_CUDA=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
)


class LlamaBuildError(RuntimeError):
    """The sdist could not be fetched or llama-server did not build; the message says which
    step failed and where its log is."""


def cache_dir() -> Path:
    """Where binaries are kept: ``$VELVETROPE_LLAMA_CACHE`` or ``~/.cache/velvetrope/llama``."""
    env = os.environ.get("VELVETROPE_LLAMA_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "velvetrope" / "llama"


def binary_path(cache: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The cached binary's path for ``version`` (it may not exist yet)."""
    return (cache or cache_dir()) / f"llama-server-{version}"


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with log.open("ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise LlamaBuildError(f"{cmd[0]} {cmd[1]} failed (exit {proc.returncode}); log: {log}")


def _build(target: Path, version: str, jobs: int, log: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="llama-build-", dir=target.parent))
    try:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(work),
                f"llama-cpp-python=={version}",
            ],
            log,
        )
        sdists = sorted(work.glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise LlamaBuildError(f"pip downloaded no llama-cpp-python sdist; log: {log}")
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(work, filter="data")
        source = work / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
        if not (source / "CMakeLists.txt").is_file():
            raise LlamaBuildError(f"the sdist has no vendor/llama.cpp at {source}")
        build = work / "build"
        _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], log)
        _run(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
            log,
        )
        built = build / "bin" / "llama-server"
        if not built.is_file():
            raise LlamaBuildError(f"cmake finished but {built} is missing; log: {log}")
        partial = target.with_suffix(".partial")
        shutil.copy2(built, partial)
        partial.chmod(0o755)
        partial.replace(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_llama_server(
    cache: Path | None = None,
    version: str = LLAMA_CPP_PYTHON_VERSION,
    jobs: int = 2,
    quiet: bool = True,
) -> Path:
    """Return the path of a runnable ``llama-server``, building it first when it is not cached.

    Concurrent callers (two test sessions, CI and a developer) serialize on
    ``<cache>/.lock``; the second finds the first one's binary.  Raises
    :class:`LlamaBuildError` when a step fails.
    """
    root = cache or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = binary_path(root, version)
    if target.is_file():
        return target
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target
        log = root / f"build-{version}.log"
        log.write_bytes(b"")
        if not quiet:
            print(f"building llama-server {version} into {target} (log: {log})", flush=True)
        started = time.monotonic()
        _build(target, version, jobs, log)
        elapsed = time.monotonic() - started
        if not quiet:
            print(f"llama-server built in {elapsed:.0f} s: {target}", flush=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.llama_build [--cache DIR] [--jobs N]``: print the binary's path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cache", type=Path, default=None, help="cache folder")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs")
    args = parser.parse_args(argv)
    try:
        path = ensure_llama_server(args.cache, jobs=args.jobs, quiet=False)
    except LlamaBuildError as exc:
        print(f"llama-server: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
