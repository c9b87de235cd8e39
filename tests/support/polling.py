"""Waiting in tests for a condition, with a deadline, never a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["poll"]


def poll(pred: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``pred()`` holds (polled every 20 ms); fails after ``timeout_s``."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(0.02)
    return time.monotonic() - t0
