"""When the steps of a pure-decode stretch end: one sequential sum, replayed on demand.

A stretch of pure-decode steps of ``n`` sequences (:mod:`velvetrope.engine.fastforward`)
starts at ``now``; step ``j`` (from 1) attends to ``first + n * (j - 1)`` context tokens and
lasts ``head + ctx * x + tail`` seconds for that context ``x``: the profile's
``step_time(0, n, x)`` summed in its own order, the constant part folded once into
``head``.  Its end is ``e_j = e_{j-1} + duration_j`` (``e_0 = now``), added left to right
exactly as calling ``step`` once per iteration adds them, so every value here is bit for bit
the step-by-step one.

Nothing is stored: each function replays the sum from ``now``.  Compiled with mypyc
(``setup.py``), the replay is a loop of C double operations in the order written here,
which round exactly like Python's floats (IEEE double, round to nearest, no fused
multiply-add on the baseline x86-64 and arm64 targets the build uses), and costs
nanoseconds per step: less than materialising the end times as Python floats or numpy
arrays, which a stretch mostly never reads (it is cut short, or only its end is wanted).
"""

from __future__ import annotations

__all__ = ["step_end", "steps_started"]


def step_end(now: float, head: float, ctx: float, tail: float, first: int, n: int, j: int) -> float:
    """``e_j``: the end of step ``j`` (``j >= 0``; ``e_0 = now``) of the stretch above."""
    t = now
    x = float(first)  # integers below 2**53: exact, as Python converts them in ``ctx * x``
    step = float(n)
    for _ in range(j):
        t += head + ctx * x + tail
        x += step
    return t


def steps_started(
    now: float,
    head: float,
    ctx: float,
    tail: float,
    first: int,
    n: int,
    steps: int,
    at: float,
    inclusive: bool,
) -> int:
    """How many of ``e_0 .. e_{steps-1}`` (the starts of the stretch's ``steps`` steps) are
    ``<= at`` (``inclusive``) or ``< at``: ``bisect_right`` / ``bisect_left`` of ``at`` in
    that non-decreasing sequence, found by replaying it."""
    t = now
    x = float(first)
    step = float(n)
    j = 0
    while j < steps and (t <= at if inclusive else t < at):
        t += head + ctx * x + tail
        x += step
        j += 1
    return j
