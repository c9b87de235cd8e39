"""Recorded ``/admin/status`` and ``/metrics`` answers of real gateways, for ``top``'s tests.

``data/`` holds two polls, one second apart, of gateways serving traffic from the built-in
engine (two engines at speed 3, three tenants, ``max_in_flight: 4``, the batch band bounded
at 6): ``memory-K-gw0`` is one gateway with ``memory://`` state that labels its metrics by
tenant and has a third, dead upstream; ``redis-K-gwJ`` are two gateways sharing one Redis.
``K`` is the poll (0, then 1), ``J`` the gateway.  The metrics are as served, less the
histograms' ``_bucket`` lines, which ``top`` does not read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from velvetrope.top import Sample, parse_metrics

__all__ = ["DATA", "sample", "status", "text"]

DATA = Path(__file__).parent / "data"


def status(name: str) -> dict[str, Any]:
    """The recorded status ``name`` (``memory-1-gw0``...)."""
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def text(name: str) -> str:
    """The recorded metrics text ``name``."""
    return (DATA / f"{name}.prom").read_text()


def sample(name: str, url: str, at: float) -> Sample:
    """The recorded poll ``name`` as the sample of ``url`` at ``at``."""
    return Sample(url, at, status(name), parse_metrics(text(name)))
