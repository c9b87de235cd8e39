"""The batcher's per-sequence record and its two waiting queues (internal to the engine model).

:class:`SeqRecord` is the mutable bookkeeping of one sequence; :class:`FifoQueue` and
:class:`PriorityQueue` order the waiting ones (vLLM's ``fcfs`` and ``priority`` policies).
Both queues delete lazily: an aborted sequence's entry is skipped when it reaches the
head, so ``abort`` stays O(1).  Only :mod:`velvetrope.engine.batcher` uses these.
"""

from __future__ import annotations

import heapq
from collections import deque

__all__ = ["GONE", "RUNNING", "WAITING", "FifoQueue", "PriorityQueue", "SeqRecord"]

WAITING = 0
RUNNING = 1
GONE = 2


class SeqRecord:
    """Mutable per-sequence bookkeeping; ``known`` is ``prompt + generated``.

    ``hashes`` is the hash chain of the sequence's shareable full prompt blocks (empty
    without prefix caching); ``registered`` how many of them are recorded in the cache;
    ``cached`` the prompt tokens found in the cache at the latest admission,
    ``first_cached`` at the first (what the engine reports); ``spec`` the draft tokens
    scheduled in the current step.
    """

    __slots__ = (
        "arrival",
        "blocks",
        "cached",
        "computed",
        "decoding",
        "first_cached",
        "generated",
        "hashes",
        "known",
        "new",
        "order",
        "output",
        "preemptions",
        "priority",
        "prompt",
        "registered",
        "scheduled_at",
        "seq_id",
        "spec",
        "state",
    )

    def __init__(
        self,
        seq_id: str,
        prompt: int,
        output: int,
        priority: int,
        arrival: float,
        order: int,
        hashes: tuple[int, ...] = (),
    ) -> None:
        self.seq_id = seq_id
        self.prompt = prompt
        self.output = output
        self.priority = priority
        self.arrival = arrival
        self.order = order
        self.hashes = hashes
        self.known = prompt
        self.generated = 0
        self.computed = 0
        self.blocks: list[int] = []
        self.state = WAITING
        self.new = 0  # tokens scheduled in the step numbered `scheduled_at`
        self.spec = 0
        self.decoding = False
        self.scheduled_at = -1
        self.preemptions = 0
        self.registered = 0
        self.cached = 0
        self.first_cached = 0

    def rank(self) -> tuple[int, float, int]:
        """Priority-mode order: lower is served first and preempted last."""
        return (self.priority, self.arrival, self.order)


class FifoQueue:
    """FCFS waiting queue; entries of aborted sequences are skipped lazily."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[SeqRecord] = deque()

    def push(self, seq: SeqRecord) -> None:
        """Append ``seq`` at the back."""
        self._q.append(seq)

    def push_front(self, seq: SeqRecord) -> None:
        """Put ``seq`` at the head (a preempted sequence)."""
        self._q.appendleft(seq)

    def peek(self) -> SeqRecord | None:
        """The head waiting sequence, or ``None``."""
        q = self._q
        while q and q[0].state != WAITING:
            q.popleft()
        return q[0] if q else None

    def pop(self) -> None:
        """Remove the entry :meth:`peek` just returned."""
        self._q.popleft()


class PriorityQueue:
    """Waiting queue ordered by ``(priority, arrival, order)``; lazy deletion as above.

    A preempted sequence is pushed back with its original key, so it goes ahead of every
    later arrival of its priority (vLLM's ``prepend_request`` on a priority queue).
    """

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h: list[tuple[int, float, int, SeqRecord]] = []

    def push(self, seq: SeqRecord) -> None:
        """Insert ``seq`` at its ``(priority, arrival, order)`` place."""
        heapq.heappush(self._h, (seq.priority, seq.arrival, seq.order, seq))

    def push_front(self, seq: SeqRecord) -> None:
        """Put back a preempted ``seq``: at its original place, as :meth:`push` does."""
        heapq.heappush(self._h, (seq.priority, seq.arrival, seq.order, seq))

    def peek(self) -> SeqRecord | None:
        """The first waiting sequence in priority order, or ``None``."""
        h = self._h
        while h and h[0][3].state != WAITING:
            heapq.heappop(h)
        return h[0][3] if h else None

    def pop(self) -> None:
        """Remove the entry :meth:`peek` just returned."""
        heapq.heappop(self._h)
