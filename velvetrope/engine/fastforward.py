"""Fast-forward of a :class:`~velvetrope.engine.Batcher` through pure-decode stretches.

Between two events that change a batch (an arrival, a finish, a preemption) a continuous
batcher mostly repeats one kind of iteration: every running sequence computes its last
sampled token and samples the next one.  Such a *pure-decode* step emits no event when the
batcher was built with ``token_events=False`` (the simulator's setting), and its duration
is ``profile.step_time(0, n, context)`` with ``context`` growing by ``n`` per step.  This
module plans a whole stretch of those steps at once (:meth:`DecodeRun.plan`) and applies
any prefix of it in closed form (:meth:`DecodeRun.apply`): O(running sequences + blocks
allocated) plus a few C float operations per step for its times (the sum of step
durations is replayed on demand by the compiled :mod:`velvetrope.engine.decode_math`, never
stored), instead of one :meth:`~velvetrope.engine.Batcher.step` call per step.

Exactness contract: after a run of batcher ``b`` is planned at ``now`` (``run.plan(now)``
returned ``True``, or ``run = plan_decode_run(b, now)``) and ``events = run.apply(j)``, the
batcher is in exactly the state ``j`` calls of ``b.step`` would have left it in,
starting at ``now`` and each starting when the previous one ended (every sequence's
counters, block tables in the same order with the same block ids, the allocator's free
list and, with prefix caching, its evictions, the step count); ``events`` are the events
the ``j``-th call would have returned and ``run.start(j)`` is bit for bit the end time it
would have reported (``now + d1 + d2 + ...``, summed in the same order).  The tests check
this against step-by-step for every built-in profile, with and without preemption, with
prefix caching and with speculative decoding.

A stretch starting at ``now`` is planned only when, for each of its steps,

* every running sequence is decoding (``prompt + generated - computed == 1`` and at least
  one token generated), so all of them are scheduled (the token budget covers
  ``max_num_seqs``) and none speculates (speculative decoding draws random acceptances:
  with ``spec_tokens > 0`` no stretch is planned and the caller steps as usual);
* no sequence finishes before the last step: the stretch ends with the first step in
  which some sequences produce their last token (that step's :class:`Finished` events are
  what :meth:`DecodeRun.apply` returns for it), or earlier;
* no block request can fail: the blocks the stretch takes are free at its start, so no
  preemption happens (the stretch is cut before the first step that would run short);
* nothing is admitted: the waiting queue is empty, or the batch is full, or (without
  prefix caching) the head's first chunk does not fit after the first step's block
  requests (before them with ``prefill_first``, whose steps try the waiting prompts
  first); free blocks only decrease until the last step, so it never fits later;
* the batcher reports no per-token events (``token_events=False``).  With multi-step
  scheduling (``num_scheduler_steps > 1``) fewer steps try to admit, so the conditions
  above still hold; the batcher's step count, which decides which steps try, advances by
  the steps applied.

Block boundaries are not stretch ends: a sequence with ``c`` computed tokens takes a new
block at step ``j`` exactly when ``c + j - 1`` is a multiple of ``block_size``, and the
blocks of all boundaries are handed out in step order, then running order, as the
step-by-step allocator would (one ``allocate`` of ``k`` blocks takes exactly the blocks
``k`` single allocations would, in that order, for both allocators).

A planned run does not touch the batcher until :meth:`DecodeRun.apply`.  The caller must
apply it (up to the step in progress) before anything else reads or changes the batcher;
:meth:`DecodeRun.apply` raises ``RuntimeError`` when it sees that the batcher moved since
the plan (stepped, added to, aborted from).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import accumulate
from operator import add

from velvetrope.engine.batcher import Batcher
from velvetrope.engine.decode_math import (
    blocks_taken,
    deal_blocks,
    longest_fit,
    step_end,
    steps_started,
)
from velvetrope.engine.events import EngineEvent, Finished
from velvetrope.engine.profile import EngineProfile
from velvetrope.engine.queues import GONE, SeqRecord

__all__ = ["DecodeRun", "RunCounts", "plan_decode_run"]


@dataclass(slots=True)
class RunCounts:
    """How the decode runs that share it went (one object per simulation, or per batcher).

    ``whole``: applications that reached a run's last step; ``cut``: applications that
    stopped at a step in progress, because something touched the batcher first; ``steps``:
    the engine steps all of them advanced.  ``ties_inclusive`` and ``ties_exclusive`` count the
    :meth:`DecodeRun.started` calls at a time when a step of the run starts exactly, by the
    ``inclusive`` they were asked with (how often the tie rules decided something).
    """

    whole: int = 0
    cut: int = 0
    steps: int = 0
    ties_inclusive: int = 0
    ties_exclusive: int = 0


class DecodeRun:
    """A stretch of ``steps`` pure-decode steps of one batcher, planned by :meth:`plan` and
    applied on demand.

    ``start(j)`` (``0 <= j <= steps``) is the start of step ``j + 1``, i.e. the end of step
    ``j``; ``start(0)`` is the plan's ``now`` and :attr:`end` the end of the last step.
    ``finishes`` says whether sequences finish in the last step; ``applied`` how many steps
    the batcher has been brought through so far (:meth:`apply`); ``counts`` tallies its
    applications and ties (:class:`RunCounts`, which several runs may share).  One object
    serves one batcher: each :meth:`plan` replaces the previous plan, so a caller that plans
    stretch after stretch keeps one object per batcher instead of building one per stretch
    (:func:`plan_decode_run` builds one).
    """

    __slots__ = (
        "_base",
        "_batcher",
        "_computed",
        "_ctx",
        "_first",
        "_head",
        "_n_waiting",
        "_now",
        "_order",
        "_running",
        "_size",
        "_t",
        "_tail",
        "applied",
        "counts",
        "end",
        "finishes",
        "steps",
    )

    def __init__(self, batcher: Batcher, counts: RunCounts | None = None) -> None:
        """No plan yet (nothing to apply): :meth:`plan` makes one.  Applications and ties are
        tallied in ``counts`` (a new :class:`RunCounts` if none is given)."""
        self._batcher = batcher
        self.counts = RunCounts() if counts is None else counts
        self._running: list[SeqRecord] = batcher._running
        self._computed: list[int] = []  # each running sequence's computed tokens at the plan
        self._size = self._base = self._order = self._n_waiting = self._first = 0
        self._now = self._head = self._ctx = self._tail = self.end = 0.0
        self._t: list[float] | None = None
        self.steps = self.applied = 0
        self.finishes = False

    def plan(self, now: float, min_steps: int = 2) -> bool:
        """Plan the longest pure-decode stretch of the batcher starting at ``now``.

        Returns ``False`` when fewer than ``min_steps`` (>= 1) steps qualify (see the module
        docstring): the caller then calls ``batcher.step(now)`` as usual, and there is
        nothing to apply.  Costs O(running sequences + steps); changes nothing (the waiting
        queue may drop entries of aborted sequences, as ``step`` would).
        """
        self.applied = self.steps  # nothing to apply unless this plan succeeds
        b = self._batcher
        p = b._profile
        running = b._running
        n = len(running)
        if not n or p.spec_tokens or b._token_events:
            return False
        bs = p.block_size
        free = b._kv.num_free
        admit = 0  # blocks the waiting head's first chunk needs, if each step tries to admit it
        first_fit = b._prefill_first  # admission is tried before the running sequences' blocks
        budget = p.max_num_batched_tokens - (0 if first_fit else n)
        if b._n_waiting and budget > 0 and n < p.max_num_seqs:
            queued = b._waiting.peek()
            if queued is not None:
                if b._pc is not None:
                    return False
                admit = -(-min(queued.known, budget) // bs)
                if admit <= free - (0 if first_fit else n):
                    return False  # it fits whatever the first step allocates
        steps = p.max_model_len
        c0: list[int] = []
        context = 0
        for s in running:
            c = s.computed
            if s.known - c != 1 or not s.generated:
                return False  # (decoding, its prefix blocks are all computed and registered)
            left = s.output - s.generated
            if left < steps:
                if left < min_steps:
                    return False
                steps = left
            c0.append(c)
            context += c
        finishes = True
        if blocks_taken(c0, 0, steps, bs) > free:
            finishes = False
            steps = longest_fit(c0, steps - 1, bs, free)  # the longest prefix whose blocks are free
            if steps < min_steps:
                return False
        if admit and not first_fit and admit <= free - sum(1 for c in c0 if c % bs == 0):
            return False
        self._running = running
        self._computed = c0
        self._size = n
        self._base = b._steps
        self._order = b._order
        self._n_waiting = b._n_waiting
        self.steps = steps
        self.finishes = finishes
        self.applied = 0
        # Step j lasts step_time(0, n, first + n * (j - 1)): in closed form (replayed by
        # velvetrope.engine.decode_math), or summed into a list when the closed form does
        # not reproduce the profile's step_time (exact, only slower).
        first = context + n
        self._now, self._first = now, first
        lin = _LINEAR.get(n)
        if lin is None or lin[0] is not p:
            lin = _linear(p, n)
        if lin[1]:
            self._t = None
            head, ctx, tail = self._head, self._ctx, self._tail = lin[2], lin[3], lin[4]
            self.end = step_end(now, head, ctx, tail, first, n, steps)
        else:
            step_time = p.step_time
            rng = range(first, first + n * steps, n)
            t = list(accumulate([step_time(0, n, x) for x in rng], add, initial=now))
            self._t = t
            self.end = t[steps]
        return True

    def start(self, j: int) -> float:
        """When step ``j + 1`` starts (step ``j`` ends), ``0 <= j <= steps``."""
        t = self._t
        if t is None:
            return step_end(
                self._now, self._head, self._ctx, self._tail, self._first, self._size, j
            )
        return t[j]

    def started(self, t: float, *, inclusive: bool) -> int:
        """How many steps of the stretch have started by ``t``.

        A step starting exactly at ``t`` counts when ``inclusive`` (the caller handles
        ``t`` after the batcher's own step boundary at ``t``), not otherwise.
        """
        starts = self._t
        if starts is None:
            j, tie = steps_started(
                self._now, self._head, self._ctx, self._tail, self._first, self._size,
                self.steps, t, inclusive,
            )  # fmt: skip
        elif inclusive:
            j = bisect.bisect_right(starts, t, 0, self.steps)
            tie = j > 0 and starts[j - 1] == t
        else:
            j = bisect.bisect_left(starts, t, 0, self.steps)
            tie = j < self.steps and starts[j] == t
        if tie:
            if inclusive:
                self.counts.ties_inclusive += 1
            else:
                self.counts.ties_exclusive += 1
        return j

    def kv_usage(self, steps: int) -> float:
        """The batcher's ``kv_usage`` once brought through the first ``steps`` steps of the
        run (``applied <= steps < self.steps``), without applying them: the blocks those
        steps take are the only change a reading sees (nothing is admitted or finishes
        before the last step)."""
        b = self._batcher
        kv = b._kv
        done = self.applied
        taken = blocks_taken(self._computed, done, steps - done, b._profile.block_size)
        return (kv.num_blocks - (kv.num_free - taken)) / kv.num_blocks  # as BlockPool.usage

    def apply(self, steps: int) -> list[EngineEvent]:
        """Bring the batcher through the first ``steps`` steps of the run
        (``applied <= steps <= self.steps``), as ``steps - applied`` more calls of
        :meth:`~velvetrope.engine.Batcher.step` would (see the module docstring).

        Returns the events of step ``steps`` (stamped ``start(steps)``) when it is newly
        applied: the :class:`Finished` events when it is the last step and :attr:`finishes`,
        else none (earlier steps have none).  Nothing else may change the batcher between
        applies; once the last step is applied the run is spent.
        """
        done = self.applied
        if not done <= steps <= self.steps or done == self.steps:
            raise ValueError(f"a run of {self.steps} steps at step {done} cannot apply {steps}")
        b = self._batcher
        running = self._running
        if (
            b._steps != self._base
            or b._running is not running
            or len(running) != self._size
            or b._order != self._order
            or b._n_waiting != self._n_waiting
        ):
            raise RuntimeError("the batcher changed since this decode run was planned")
        delta = steps - done
        if not delta:
            return []
        counts = self.counts
        counts.steps += delta
        if steps == self.steps:
            counts.whole += 1
        else:
            counts.cut += 1
        kv = b._kv
        bs = b._profile.block_size
        c = self._computed
        taken = blocks_taken(c, done, delta, bs)
        if taken:  # one allocation == `taken` single ones, in order
            if self._size == 1:
                kv.allocate(taken, running[0].blocks)
            else:
                got: list[int] = []
                kv.allocate(taken, got)
                deal_blocks(c, done, got, bs, [s.blocks for s in running])
        stamp = self._base = b._steps = b._steps + delta
        self.applied = steps
        for s in running:
            s.computed += delta
            s.generated += delta
            s.known += delta
            if not s.decoding:  # (a decoding sequence has new == 1 and spec == 0 already)
                s.new = 1
                s.decoding = True
                s.spec = 0
            s.scheduled_at = stamp
        if steps < self.steps or not self.finishes:
            return []
        # the last step, in which sequences finish: their events, their blocks freed
        t = self.end
        seqs = b._seqs
        events: list[EngineEvent] = []
        left: list[SeqRecord] = []
        for s in running:
            g = s.generated
            if g == s.output:
                events.append(Finished(s.seq_id, t, s.prompt, g, s.first_cached))
                kv.free(s.blocks)
                s.state = GONE
                del seqs[s.seq_id]
            else:
                left.append(s)
        b._running = left
        return events


def plan_decode_run(batcher: Batcher, now: float, min_steps: int = 2) -> DecodeRun | None:
    """A new :class:`DecodeRun` of ``batcher`` planned at ``now`` (:meth:`DecodeRun.plan`),
    or ``None`` when no stretch of ``min_steps`` steps qualifies."""
    run = DecodeRun(batcher)
    return run if run.plan(now, min_steps) else None


_LINEAR: dict[int, tuple[EngineProfile, bool, float, float, float]] = {}
"""Per batch size, the profile last seen with it, whether the closed form reproduces its
``step_time`` and, if so, its constant part, context coefficient and tail (:func:`_linear`).
Keyed by the batch size alone, which is cheaper than a tuple key: the caller takes an entry
only if its profile is the batcher's, and replaces it otherwise."""


def _linear(p: EngineProfile, n: int) -> tuple[EngineProfile, bool, float, float, float]:
    """``(p, exact, head, ctx, tail)`` with ``step_time(0, n, c) == head + ctx * c + tail``
    bit for bit (the order step_time sums in) when ``exact``, checked at two contexts and
    kept in :data:`_LINEAR` under ``n`` (looked up there first by the caller)."""
    head = p.step_base_s + p.tp_allreduce_s + p.per_prefill_token_s * 0 + p.per_decode_seq_s * n
    ctx, tail = p.per_context_token_s, p.tp_per_token_s * n
    exact = all(head + ctx * c + tail == p.step_time(0, n, c) for c in (n, 10**6 + n))
    hit = _LINEAR[n] = (p, exact, head, ctx, tail)
    return hit
