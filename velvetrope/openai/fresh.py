"""Imported first by :mod:`velvetrope.openai`: in a source checkout, refuses to run a module
of this package compiled (``setup.py``'s list) from an older version of its source, as
:mod:`velvetrope.core.fresh` does for the core."""

from pathlib import Path

from velvetrope.core.fresh import refuse_stale_builds

__all__: list[str] = []

refuse_stale_builds(Path(__file__).parent)
