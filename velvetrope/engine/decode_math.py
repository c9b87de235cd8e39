"""The arithmetic of a pure-decode stretch: when its steps end, which KV blocks they take.

A stretch of pure-decode steps of ``n`` sequences (:mod:`velvetrope.engine.fastforward`)
starts at ``now``; step ``j`` (from 1) attends to ``first + n * (j - 1)`` context tokens and
lasts ``head + ctx * x + tail`` seconds for that context ``x``: the profile's
``step_time(0, n, x)`` summed in its own order, the constant part folded once into
``head``.  Its end is ``e_j = e_{j-1} + duration_j`` (``e_0 = now``), added left to right
exactly as calling ``step`` once per iteration adds them, so every value here is bit for bit
the step-by-step one.  Nothing is stored: :func:`step_end` and :func:`steps_started` replay
the sum from ``now``.

A sequence with ``c`` computed tokens takes a new block at step ``j`` exactly when
``c + j - 1`` is a multiple of ``block_size`` (:func:`blocks_taken`, :func:`longest_fit`);
:func:`deal_blocks` hands a stretch's blocks out in the order single allocations would.

Compiled with mypyc (``setup.py``), the time sums are loops of C double operations in the
order written here, which round exactly like Python's floats (IEEE double, round to
nearest, no fused multiply-add on the baseline x86-64 and arm64 targets the build uses),
and cost nanoseconds per step: less than materialising the end times as Python floats or
numpy arrays, which a stretch mostly never reads (it is cut short, or only its end is
wanted).
"""

from __future__ import annotations

__all__ = ["blocks_taken", "deal_blocks", "longest_fit", "step_end", "steps_started"]


def step_end(now: float, head: float, ctx: float, tail: float, first: int, n: int, j: int) -> float:
    """``e_j``: the end of step ``j`` (``j >= 0``; ``e_0 = now``) of the stretch above."""
    t = now
    x = float(first)  # integers below 2**53: exact, as Python converts them in ``ctx * x``
    step = float(n)
    i = 0
    while i < j:  # (not ``for _ in range``: compiled, that boxes the counter)
        t += head + ctx * x + tail
        x += step
        i += 1
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
) -> tuple[int, bool]:
    """How many of ``e_0 .. e_{steps-1}`` (the starts of the stretch's ``steps`` steps) are
    ``<= at`` (``inclusive``) or ``< at``: ``bisect_right`` / ``bisect_left`` of ``at`` in
    that non-decreasing sequence, found by replaying it; and whether a start equals ``at``
    exactly (the last one counted when ``inclusive``, else the first one not counted)."""
    t = now
    last = t
    x = float(first)
    step = float(n)
    j = 0
    while j < steps and (t <= at if inclusive else t < at):
        last = t
        t += head + ctx * x + tail
        x += step
        j += 1
    if inclusive:
        return j, j > 0 and last == at
    return j, j < steps and t == at


def blocks_taken(computed: list[int], done: int, steps: int, block_size: int) -> int:
    """Blocks taken by ``steps`` decode steps of sequences with ``computed[i] + done`` tokens
    (``done``: the steps of the stretch already taken)."""
    total = 0
    for c in computed:
        first = 1 + (-(c + done)) % block_size
        if first <= steps:
            total += (steps - first) // block_size + 1
    return total


def longest_fit(computed: list[int], most: int, block_size: int, free: int) -> int:
    """The largest ``steps`` in ``[0, most]`` whose :func:`blocks_taken` (from ``computed``)
    is at most ``free`` (the count grows with ``steps``: a binary search)."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if blocks_taken(computed, 0, mid, block_size) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def deal_blocks(
    computed: list[int], done: int, got: list[int], block_size: int, tables: list[list[int]]
) -> None:
    """Append ``got`` (the blocks of a stretch, in allocation order) to the block tables of
    its sequences (``tables[i]`` for the one with ``computed[i] + done`` tokens, in running
    order).

    Every ``block_size`` steps each sequence takes one block, at the step given by its
    computed tokens mod ``block_size``: ordered by (first boundary, running index), the
    sequences take the blocks in turns, the last turn cut short."""
    n = len(computed)
    total = len(got)
    turns = [(-(c + done)) % block_size * n + i for i, c in enumerate(computed)]
    turns.sort()  # by first boundary, then running index
    for r in range(n):
        table = tables[turns[r] % n]
        i = r
        while i < total:
            table.append(got[i])
            i += n
