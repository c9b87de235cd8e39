"""``velvetrope --version``: the version and the commit the copy was built from (git in a
checkout, the file setup.py writes into a built package, else ``unknown``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from typer.testing import CliRunner

from velvetrope import __version__
from velvetrope.build_info import COMMIT_FILE, build_commit, git_commit
from velvetrope.cli import app

ROOT = Path(__file__).resolve().parents[1]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_version_option_prints_the_version_and_this_checkouts_commit() -> None:
    head = _git(ROOT, "rev-parse", "HEAD")
    for argv in (["--version"], ["version"]):
        out = CliRunner().invoke(app, argv)
        assert out.exit_code == 0, out.output
        line = out.output.strip()
        assert line.startswith(f"velvetrope {__version__} (commit {head}"), line
        assert line.endswith(")") and "\n" not in line


def test_a_built_package_reads_the_commit_setup_py_wrote(tmp_path: Path) -> None:
    package = tmp_path / "site-packages" / "velvetrope"
    package.mkdir(parents=True)
    assert build_commit(package) == "unknown"
    (package / COMMIT_FILE).write_text("0123abcd\n")
    assert build_commit(package) == "0123abcd"


def test_git_answers_only_for_the_checkouts_own_package(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    nested = repo / ".venv" / "lib" / "velvetrope"  # an install inside someone's checkout
    own = repo / "velvetrope"
    for d in (nested, own):
        d.mkdir(parents=True)
    (own / "x.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "velvetrope/x.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = _git(repo, "rev-parse", "HEAD")
    assert git_commit(nested) is None
    assert build_commit(nested) == "unknown"
    assert git_commit(own) == head
    (own / "x.py").write_text("x = 2\n")
    assert build_commit(own) == head + "-dirty"
