"""Reproducible studies of velvetrope's policies; see ``experiments/README.md``.

Each study is a package ``experiments/<letter>_<name>/`` whose ``run.py`` regenerates the
``REPORT.md`` and PNG plots next to it: ``.venv/bin/python -m experiments.<letter>_<name>.run``
from the repository root.  Shared helpers live in :mod:`experiments.common`.
"""
