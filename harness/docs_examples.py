"""The documentation's examples, run: ``python -m harness.docs_examples [PAGE ...]``.

Every fenced block of shell or Python in ``README.md``, ``docs/**/*.md`` and the files the
docs include (:data:`INCLUDED`) (languages
``bash``, ``sh``, ``shell``, ``console``, ``python``, ``py``) carries a marker on the line
just above its fence:

- ``<!-- run -->``: the tests run it (``tests/test_docs.py``);
- ``<!-- norun: REASON -->``: it is not run, and REASON says why (a GPU, a Kubernetes
  cluster, an hour of load); the tests require the reason.

An output block (any language, usually ``text``) marked ``<!-- output -->`` shows what the
``run`` block before it prints: each of its non-blank lines must be a line of that block's
output (trailing blanks aside), so a page that quotes a command's output fails when the
output moves.

A block without a marker fails the tests, so a new example is either run or excused in
words.  Output, YAML and other blocks (``text``, ``yaml``, ``promql``) are not commands and
carry no marker.

A page's ``run`` blocks are one script, in page order: shell blocks as they are, a Python
block as ``python - <<'EOF' ... EOF``, under ``set -euo pipefail`` (any failing command
fails the page) and in a fresh directory that links the checkout's ``examples``, ``deploy``,
``bench`` and ``experiments``, with this interpreter's ``bin`` first on ``PATH``.  Servers a
page starts in the background (``velvetrope engine ... &``) are stopped when the script
ends.  The ports the pages write (:data:`PORTS`: 8001 and 8002 for engines, 8080 for the
gateway) are replaced by free ports, so a run never meets another server on them.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from velvetrope.serving.launch import free_port

__all__ = [
    "COMMAND_LANGUAGES",
    "DOCS",
    "INCLUDED",
    "PORTS",
    "Block",
    "blocks",
    "output_mismatches",
    "outputs",
    "page_script",
    "pages",
    "run_page",
    "unmarked",
]

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
COMMAND_LANGUAGES = frozenset({"bash", "sh", "shell", "console", "python", "py"})
PORTS = (8001, 8002, 8080)
LINKED = ("examples", "deploy", "bench", "experiments")
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
_MARK = re.compile(r"^<!--\s*(?P<kind>run|norun|output)\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")
_SEPARATOR = "@@velvetrope-docs-block {}@@"
INCLUDED = ("deploy/README.md",)
"""Files outside ``docs/`` that a page includes whole (``--8<--``), checked like a page."""


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, first line (1-based), language, marker and body."""

    page: Path
    line: int
    language: str
    marker: str | None
    reason: str
    body: str

    @property
    def runs(self) -> bool:
        return self.marker == "run"

    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, with the marker on the line above each (if any)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, start = m["fence"], i
        mark = _MARK.match(lines[i - 1].strip()) if i > 0 else None
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            i += 1
        found.append(
            Block(
                page=page,
                line=start + 1,
                language=m["lang"].lower(),
                marker=mark["kind"] if mark else None,
                reason=(mark["reason"] or "") if mark else "",
                body="\n".join(lines[start + 1 : i]),
            )
        )
        i += 1
    return found


def pages() -> list[Path]:
    """``README.md``, :data:`INCLUDED` and every Markdown page under ``docs/``, sorted."""
    return [ROOT / "README.md", *(ROOT / p for p in INCLUDED), *sorted(DOCS.rglob("*.md"))]


def unmarked(page: Path) -> list[str]:
    """Where ``page`` has a shell or Python block with no marker, or ``norun`` with no reason."""
    bad = []
    for b in blocks(page):
        if b.language not in COMMAND_LANGUAGES:
            continue
        if b.marker is None:
            bad.append(f"{b.where()}: {b.language} block without <!-- run --> or <!-- norun: -->")
        elif b.marker == "norun" and not b.reason:
            bad.append(f"{b.where()}: <!-- norun --> without a reason")
        elif b.marker == "output":
            bad.append(f"{b.where()}: <!-- output --> on a {b.language} block (use text)")
    return bad


def page_script(page: Path, ports: dict[int, int] | None = None) -> str:
    """The bash script of ``page``'s run blocks; ``ports`` maps the pages' ports to others."""
    parts = [
        "set -euo pipefail",
        # stop what the page started in the background, whatever ends the script
        "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT",
    ]
    for b in blocks(page):
        if not b.runs:
            continue
        parts.append(f"# {b.where()}")
        # on a line of its own, even after output that ends without a newline
        parts.append(f"printf '\\n%s\\n' '{_SEPARATOR.format(b.line)}'")
        if b.language in ("python", "py"):
            parts.append(f"python - <<'VELVETROPE_DOCS_PY'\n{b.body}\nVELVETROPE_DOCS_PY")
        else:
            parts.append(b.body)
    script = "\n".join(parts) + "\n"
    for old, new in (ports or {}).items():
        script = re.sub(rf"(?<=[:\s]){old}\b", str(new), script)
    return script


def outputs(stdout: str) -> dict[int, list[str]]:
    """A page script's output by run block (its first line), the lines without trailing
    blanks."""
    found: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        m = re.fullmatch(_SEPARATOR.format(r"(\d+)"), line.strip())
        if m:
            current = found.setdefault(int(m.group(1)), [])
        elif current is not None:
            current.append(line.rstrip())
    return found


def output_mismatches(page: Path, stdout: str) -> list[str]:
    """Where an ``<!-- output -->`` block of ``page`` shows a line that the run block before
    it did not print (``stdout``: the page script's)."""
    printed = outputs(stdout)
    bad: list[str] = []
    last_run: Block | None = None
    for b in blocks(page):
        if b.runs:
            last_run = b
        if b.marker != "output":
            continue
        if last_run is None:
            bad.append(f"{b.where()}: an output block with no run block before it")
            continue
        said = set(printed.get(last_run.line, []))
        bad += [
            f"{b.where()}: not printed by {last_run.where()}: {line.rstrip()!r}"
            for line in b.body.splitlines()
            if line.strip() and line.rstrip() not in said
        ]
    return bad


def run_page(
    page: Path, workdir: Path, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run ``page``'s script in ``workdir`` (linked to the checkout's example folders)."""
    for name in LINKED:
        link = workdir / name
        if not link.exists():
            link.symlink_to(ROOT / name)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    script = page_script(page, {p: free_port() for p in PORTS})
    return subprocess.run(
        ["bash", "-c", script],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m harness.docs_examples", description=__doc__)
    ap.add_argument("pages", nargs="*", type=Path, help="pages to run (default: every page)")
    args = ap.parse_args(argv)
    bad = 0
    for page in [p.resolve() for p in args.pages] or pages():
        problems = unmarked(page)
        if not any(b.runs for b in blocks(page)) and not problems:
            continue
        if not problems:
            with tempfile.TemporaryDirectory() as tmp:
                proc = run_page(page, Path(tmp))
            if proc.returncode != 0:
                problems = [f"exit {proc.returncode}", proc.stdout[-3000:], proc.stderr[-3000:]]
            else:
                problems = output_mismatches(page, proc.stdout)
        bad += bool(problems)
        print(f"{page.relative_to(ROOT)}: {'ok' if not problems else 'FAILED'}", flush=True)
        for p in problems:
            print(p)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
