"""Counts in the planner's sentences: ``1 replica``, ``2 replicas``, ``1 GPU``."""

from __future__ import annotations

__all__ = ["count"]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural (``plural``, else ``noun + "s"``) unless n is 1."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
