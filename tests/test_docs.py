"""The documentation's examples (``harness.docs_examples``): every shell or Python block on
a page is marked to run or excused with a reason, and each page's ``run`` blocks pass as
one script against real servers on loopback (``velvetrope engine``, ``velvetrope serve``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.docs_examples import (
    ROOT,
    blocks,
    output_mismatches,
    page_script,
    pages,
    run_page,
    unmarked,
)

RUNNABLE = [p for p in pages() if any(b.runs for b in blocks(p))]


def test_every_command_block_is_marked_run_or_excused() -> None:
    bad = [problem for page in pages() for problem in unmarked(page)]
    assert not bad, "\n".join(bad)


def test_the_pages_that_promise_running_examples_have_them() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in RUNNABLE}
    assert {
        "README.md",
        "docs/getting-started/quickstart.md",
        "docs/concepts/admission-core.md",
        "docs/operations/reload.md",
        "docs/simulator.md",
        "docs/planner.md",
    } <= names, names


def test_markers_and_ports_are_read_as_documented(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- run -->\n```bash\ncurl http://127.0.0.1:8080/x --port 8001\n```\n\n"
        "<!-- norun: needs a GPU -->\n```bash\nvllm serve m\n```\n\n"
        "```bash\nunmarked\n```\n\n<!-- norun -->\n```python\nx = 1\n```\n\n"
        "```text\nplain output, no marker needed\n```\n"
        "<!-- run -->\n```python\nprint(18080)\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.marker, b.reason) for b in found] == [
        ("bash", "run", ""),
        ("bash", "norun", "needs a GPU"),
        ("bash", None, ""),
        ("python", "norun", ""),
        ("text", None, ""),
        ("python", "run", ""),
    ]
    assert [p.split(": ", 1)[1] for p in unmarked(page)] == [
        "bash block without <!-- run --> or <!-- norun: -->",
        "<!-- norun --> without a reason",
    ]
    script = page_script(page, {8080: 50001, 8001: 50002})
    assert "curl http://127.0.0.1:50001/x --port 50002" in script
    assert "print(18080)" in script  # only whole port numbers move
    assert "vllm serve" not in script and "unmarked" not in script


def test_quoted_output_must_be_what_the_block_before_it_prints(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- run -->\n```bash\necho 'replicas  7'\necho other\n```\n"
        "<!-- output -->\n```text\nreplicas  7\n\n```\n"
        "<!-- run -->\n```python\nprint('knee 107')\n```\n"
        "<!-- output -->\n```text\nknee 108\nother\n```\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    proc = run_page(page, work)
    assert proc.returncode == 0, proc.stderr
    assert [m.split(": ", 1)[1] for m in output_mismatches(page, proc.stdout)] == [
        f"not printed by {page}:12: 'knee 108'",
        f"not printed by {page}:12: 'other'",  # printed, but by another block
    ]
    bash_output = tmp_path / "bad.md"
    bash_output.write_text("<!-- output -->\n```bash\nls\n```\n")
    assert unmarked(bash_output) == [f"{bash_output}:2: <!-- output --> on a bash block (use text)"]


def test_a_failing_example_fails_its_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- run -->\n```bash\ntrue\nfalse\necho not reached\n```\n")
    work = tmp_path / "work"
    work.mkdir()
    proc = run_page(page, work)
    assert proc.returncode != 0 and "not reached" not in proc.stdout


@pytest.mark.integration
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_pages_examples_run(page: Path, tmp_path: Path) -> None:
    try:
        proc = run_page(page, tmp_path)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{page.name}: still running after {e.timeout} s\n{e.stdout!r}")
    assert proc.returncode == 0, (
        f"{page.relative_to(ROOT)} failed (exit {proc.returncode}):\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    drift = output_mismatches(page, proc.stdout)
    assert not drift, "the page quotes output its commands no longer print:\n" + "\n".join(drift)
