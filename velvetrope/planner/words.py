"""Numbers in the planner's sentences: counts (``1 replica``, ``2 replicas``, ``1 GPU``),
seconds (``800 ms``, ``4 s``) and rates or counts to three significant figures."""

from __future__ import annotations

import math

__all__ = ["count", "figure", "seconds"]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural (``plural``, else ``noun + "s"``) unless n is 1."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def seconds(x: float) -> str:
    """Seconds, readably (``inf`` for an overloaded fleet)."""
    if not math.isfinite(x):
        return "∞ (overloaded)"
    if x == 0:
        return "0 s"
    if x < 1:
        return f"{x * 1000:.0f} ms" if x >= 0.01 else f"{x * 1000:.2g} ms"
    return f"{x:.3g} s"


def figure(x: float) -> str:
    """A rate or count with three significant figures and thousands separators."""
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"
