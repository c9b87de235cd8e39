"""Which commit this copy of velvetrope was built from, for ``velvetrope --version``.

In a source checkout (the package directory is ``velvetrope/`` at the top of a git work
tree) the answer is git's, asked at run time: ``HEAD``'s commit, with ``-dirty`` when the
work tree has changes.  A built wheel has no git: ``setup.py`` writes the commit into the
package as :data:`COMMIT_FILE` at build time.  Where neither answers, ``unknown``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["COMMIT_FILE", "build_commit", "git_commit", "version_line"]

PACKAGE = Path(__file__).resolve().parent
COMMIT_FILE = "BUILD_COMMIT"
"""The file, beside this module in a built package, that holds the build's commit."""


def _git(directory: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_commit(package: Path = PACKAGE) -> str | None:
    """HEAD's commit (``-dirty`` when the work tree has changes) if ``package`` sits at the
    top of a git work tree; None otherwise (an installed copy inside someone else's repo
    included)."""
    top = _git(package, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != package.parent:
        return None
    commit = _git(package, "rev-parse", "HEAD")
    if commit is None:
        return None
    status = _git(package, "status", "--porcelain", "--untracked-files=no")
    return commit + ("-dirty" if status else "")


def build_commit(package: Path = PACKAGE) -> str:
    """The commit this copy came from: git's in a checkout, else the one written at build
    time (:data:`COMMIT_FILE`), else ``unknown``."""
    commit = git_commit(package)
    if commit is not None:
        return commit
    try:
        written = (package / COMMIT_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        written = ""
    return written or "unknown"


def version_line() -> str:
    """``velvetrope VERSION (commit COMMIT)``."""
    from velvetrope import __version__

    return f"velvetrope {__version__} (commit {build_commit()})"
