"""MkDocs hooks (``mkdocs.yml``: ``hooks``): put the studies' reports on the site.

``docs/studies/index.md`` includes ``experiments/README.md``, whose verdict table links each
study's ``REPORT.md`` by a path relative to it (``h_saturation/REPORT.md``).  This hook adds
every ``experiments/*/REPORT.md`` and the plots beside it to the site under ``studies/``, so
those links resolve and strict mode checks them like any other page's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

__all__ = ["on_files"]

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"
SUFFIXES = (".md", ".png")


def on_files(files: Files, config: Any, **_: Any) -> Files:
    """Add each study's report and plots as ``studies/<study>/<file>``."""
    for path in sorted(EXPERIMENTS.glob("*/*")):
        if path.suffix in SUFFIXES and path.is_file() and path.parent.name[:1].isalpha():
            uri = f"studies/{path.parent.name}/{path.name}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
