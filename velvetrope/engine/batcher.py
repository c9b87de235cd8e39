"""A sans-IO continuous batcher: vLLM v1's scheduler over a paged KV cache, stepped by time.

The :class:`Batcher` holds sequences and, each time :meth:`Batcher.step` is called with a
timestamp, schedules one engine iteration, advances every scheduled sequence and reports
what the iteration produced.  It never reads a clock and never sleeps: the simulator steps
it in virtual time, the engine server in real time (``step`` says how long the iteration
takes; the server waits that long before delivering the events).

Model (vLLM v1, simplified but faithful)
----------------------------------------
A sequence has ``prompt`` tokens, will produce exactly ``output`` tokens (the caller decided
where EOS falls), has ``generated`` tokens so far and ``computed`` tokens in the KV cache.
Its known tokens are ``prompt + generated``; an iteration computes ``new`` of the
``prompt + generated - computed`` not yet cached.  When the iteration caches all of them the
model samples one token: ``generated += 1``.  So a prefill computes the prompt (in chunks if
the step's token budget is smaller) and ends by emitting the first token; each decode
iteration then computes the last sampled token and emits the next one.  The last token is
never cached, exactly like vLLM.

One :meth:`~Batcher.step`:

1. **Running sequences**, in admission order: each gets ``new = min(uncached, budget)``
   tokens (``budget`` starts at ``max_num_batched_tokens``) and blocks for
   ``ceil((computed + new) / block_size)`` slots.  If a block is needed and none is free,
   the batcher **preempts by recompute**: the most recently admitted running sequence
   (with ``priority=True``: the one with the largest ``(priority, arrival)``) loses all its
   blocks and its ``computed`` progress, goes back to the front of the waiting queue and a
   :class:`Preempted` event is emitted.  Its ``generated`` tokens stay emitted; on return
   it re-prefills ``prompt + generated`` tokens and then continues with the next token.
   A victim already scheduled this step is unscheduled (its budget returned).  If the
   victim is the sequence being scheduled, no further running sequence is scheduled; in
   priority mode that can leave the step with nothing scheduled, and then no forward pass
   runs: the step has zero duration and only :class:`Preempted` events, like an empty
   vLLM step.  In priority mode "the front" of the waiting queue is the sequence's own
   ``(priority, arrival)`` place, ahead of every later arrival of its priority.
2. **Waiting sequences**, only if nothing was preempted in this step: while
   ``num_running < max_num_seqs`` and budget remains, the head of the waiting queue (FCFS;
   with ``priority=True`` ordered by ``(priority, arrival)``, lower first) is admitted if
   the blocks for its first chunk are free; otherwise admission stops (head-of-line
   blocking, as in vLLM).
3. The iteration lasts ``profile.step_time(prefill_tokens, decode_seqs, context_tokens)``
   where a scheduled sequence counts as *decoding* when it computes exactly its one last
   sampled token, otherwise its ``new`` tokens count as prefill tokens (this includes the
   recompute of a preempted sequence); ``context_tokens`` sums ``computed + new`` over the
   batch (the KV length each sequence attends to).

Events are stamped with the end of the iteration (``now + duration``) and ordered:
all :class:`Preempted` first, then per scheduled sequence ``FirstToken`` (its first token
ever), ``Tokens`` and, when it reached ``output`` tokens, ``Finished``.  Every sequence
emits exactly one ``FirstToken`` and ``Tokens`` totalling exactly ``output`` tokens,
preempted or not (``Batcher(token_events=False)`` leaves out the ``Tokens`` events and
nothing else).  An aborted sequence emits nothing more.  Finished and aborted sequences are
forgotten at once (their id may be reused).

Invariants: used blocks never exceed ``num_gpu_blocks``; a running sequence holds exactly
``ceil(computed / block_size)`` blocks between steps, a waiting one none.

Cost: ``step`` is O(scheduled sequences) plus O(blocks moved); there is one Python object
per event and no per-token allocation otherwise.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Literal

from velvetrope.engine.kvcache import BlockAllocator
from velvetrope.engine.profile import EngineProfile
from velvetrope.errors import PolicyError

__all__ = [
    "Batcher",
    "EngineEvent",
    "Finished",
    "FirstToken",
    "Preempted",
    "SeqState",
    "StepResult",
    "Tokens",
]


@dataclass(frozen=True, slots=True)
class FirstToken:
    """``seq_id`` produced its first output token at ``t`` (once per sequence, ever)."""

    seq_id: str
    t: float


@dataclass(frozen=True, slots=True)
class Tokens:
    """``seq_id`` produced ``n`` new output tokens in the step ending at ``t``.

    Includes the first token; summed over a sequence's life, ``n`` equals its
    ``output_tokens`` exactly (tokens recomputed after a preemption are not re-emitted).
    This model samples one token per sequence per step, so ``n == 1``; consumers should
    still add ``n`` up (engines with speculative decoding emit several).
    """

    seq_id: str
    n: int
    t: float


@dataclass(frozen=True, slots=True)
class Finished:
    """``seq_id`` produced its last token at ``t``; its blocks are already free."""

    seq_id: str
    t: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Preempted:
    """``seq_id`` lost its KV cache in the step ending at ``t`` and waits to be recomputed."""

    seq_id: str
    t: float


EngineEvent = FirstToken | Tokens | Finished | Preempted


@dataclass(frozen=True, slots=True)
class StepResult:
    """One iteration: it starts at ``start``, lasts ``duration`` seconds, yields ``events``.

    ``prefill_tokens``, ``decode_seqs`` and ``context_tokens`` are the batch composition
    that ``duration`` was computed from.  With no work: ``duration == 0.0``, no events.
    """

    start: float
    duration: float
    events: list[EngineEvent]
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int

    @property
    def end(self) -> float:
        """``start + duration``: the timestamp of every event in this step."""
        return self.start + self.duration


@dataclass(frozen=True, slots=True)
class SeqState:
    """A snapshot of one live sequence (for tests, metrics and debugging)."""

    seq_id: str
    status: Literal["waiting", "running"]
    prompt_tokens: int
    output_tokens: int
    generated_tokens: int
    computed_tokens: int
    block_ids: tuple[int, ...]
    priority: int
    arrival: float
    num_preemptions: int

    @property
    def num_blocks(self) -> int:
        """Blocks held (``len(block_ids)``)."""
        return len(self.block_ids)


_WAITING = 0
_RUNNING = 1
_GONE = 2


class _Seq:
    """Mutable per-sequence bookkeeping; ``known`` is ``prompt + generated``."""

    __slots__ = (
        "arrival",
        "blocks",
        "computed",
        "generated",
        "known",
        "new",
        "order",
        "output",
        "preemptions",
        "priority",
        "prompt",
        "scheduled_at",
        "seq_id",
        "state",
    )

    def __init__(
        self, seq_id: str, prompt: int, output: int, priority: int, arrival: float, order: int
    ) -> None:
        self.seq_id = seq_id
        self.prompt = prompt
        self.output = output
        self.priority = priority
        self.arrival = arrival
        self.order = order
        self.known = prompt
        self.generated = 0
        self.computed = 0
        self.blocks: list[int] = []
        self.state = _WAITING
        self.new = 0  # tokens scheduled in the step numbered `scheduled_at`
        self.scheduled_at = -1
        self.preemptions = 0

    def rank(self) -> tuple[int, float, int]:
        """Priority-mode order: lower is served first and preempted last."""
        return (self.priority, self.arrival, self.order)


class _FifoQueue:
    """FCFS waiting queue; entries of aborted sequences are skipped lazily."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[_Seq] = deque()

    def push(self, seq: _Seq) -> None:
        self._q.append(seq)

    def push_front(self, seq: _Seq) -> None:
        self._q.appendleft(seq)

    def peek(self) -> _Seq | None:
        q = self._q
        while q and q[0].state != _WAITING:
            q.popleft()
        return q[0] if q else None

    def pop(self) -> None:
        """Remove the entry :meth:`peek` just returned."""
        self._q.popleft()


class _PriorityQueue:
    """Waiting queue ordered by ``(priority, arrival, order)``; lazy deletion as above.

    A preempted sequence is pushed back with its original key, so it goes ahead of every
    later arrival of its priority (vLLM's ``prepend_request`` on a priority queue).
    """

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h: list[tuple[int, float, int, _Seq]] = []

    def push(self, seq: _Seq) -> None:
        heapq.heappush(self._h, (seq.priority, seq.arrival, seq.order, seq))

    push_front = push

    def peek(self) -> _Seq | None:
        h = self._h
        while h and h[0][3].state != _WAITING:
            heapq.heappop(h)
        return h[0][3] if h else None

    def pop(self) -> None:
        """Remove the entry :meth:`peek` just returned."""
        heapq.heappop(self._h)


class Batcher:
    """A continuous-batching engine model over a paged KV cache; see the module docstring.

    ``priority=False`` is vLLM's ``fcfs`` scheduling policy, ``priority=True`` its
    ``priority`` policy.  ``token_events=False`` leaves out the :class:`Tokens` events
    (everything else is unchanged): a simulator that needs only first-token and finish
    times saves about 40% of :meth:`step`'s cost.  Not thread-safe; all methods are
    synchronous and cheap.
    """

    __slots__ = (
        "_kv",
        "_n_waiting",
        "_order",
        "_priority",
        "_profile",
        "_running",
        "_seqs",
        "_steps",
        "_token_events",
        "_waiting",
        "num_preemptions",
    )

    def __init__(
        self, profile: EngineProfile, *, priority: bool = False, token_events: bool = True
    ) -> None:
        self._profile = profile
        self._priority = priority
        self._token_events = token_events
        self._kv = BlockAllocator(profile.num_gpu_blocks, profile.block_size)
        self._seqs: dict[str, _Seq] = {}
        self._running: list[_Seq] = []
        self._waiting: _FifoQueue | _PriorityQueue = _PriorityQueue() if priority else _FifoQueue()
        self._n_waiting = 0
        self._order = 0
        self._steps = 0
        self.num_preemptions = 0
        """Preemptions since construction (cumulative)."""

    # -- inspection --------------------------------------------------------------------

    @property
    def profile(self) -> EngineProfile:
        """The engine profile this batcher models."""
        return self._profile

    @property
    def has_work(self) -> bool:
        """Whether any sequence is running or waiting (``step`` would do something)."""
        return bool(self._running) or self._n_waiting > 0

    @property
    def num_running(self) -> int:
        """Sequences admitted to the batch (holding, or about to hold, KV blocks)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences queued for admission, including preempted ones."""
        return self._n_waiting

    @property
    def num_steps(self) -> int:
        """Calls to :meth:`step` that found work, so far."""
        return self._steps

    @property
    def total_blocks(self) -> int:
        """KV-cache size in blocks (``profile.num_gpu_blocks``)."""
        return self._kv.num_blocks

    @property
    def free_blocks(self) -> int:
        """KV blocks held by no sequence."""
        return self._kv.num_free

    @property
    def used_blocks(self) -> int:
        """KV blocks held by running sequences."""
        return self._kv.num_used

    @property
    def kv_usage(self) -> float:
        """``used_blocks / total_blocks`` in ``[0, 1]`` (vLLM's ``kv_cache_usage_perc``)."""
        return self._kv.usage

    def seq_ids(self) -> list[str]:
        """Ids of the live (waiting or running) sequences, in no particular order."""
        return list(self._seqs)

    def seq_state(self, seq_id: str) -> SeqState | None:
        """A snapshot of a live sequence, or ``None`` if unknown, finished or aborted."""
        s = self._seqs.get(seq_id)
        if s is None:
            return None
        return SeqState(
            seq_id=s.seq_id,
            status="running" if s.state == _RUNNING else "waiting",
            prompt_tokens=s.prompt,
            output_tokens=s.output,
            generated_tokens=s.generated,
            computed_tokens=s.computed,
            block_ids=tuple(s.blocks),
            priority=s.priority,
            arrival=s.arrival,
            num_preemptions=s.preemptions,
        )

    # -- commands ----------------------------------------------------------------------

    def add(
        self, seq_id: str, prompt_tokens: int, output_tokens: int, now: float, priority: int = 0
    ) -> None:
        """Queue a sequence that arrived at ``now`` and will produce ``output_tokens`` tokens.

        ``priority`` matters only with ``priority=True`` (lower is served first; ties by
        arrival, then by call order).  Raises :class:`~velvetrope.errors.PolicyError` if
        either count is below 1, ``prompt + output > max_model_len`` or ``seq_id`` is
        already live.  A sequence that passes always fits the KV cache on its own: a
        profile guarantees ``max_model_len <= kv_capacity_tokens()`` (as vLLM refuses to
        start otherwise), so the batcher can never livelock on one oversized sequence.
        """
        p = self._profile
        if seq_id in self._seqs:
            raise PolicyError(f"sequence {seq_id!r} is already in the engine")
        if prompt_tokens < 1 or output_tokens < 1:
            raise PolicyError(
                f"sequence {seq_id!r}: prompt_tokens and output_tokens must be >= 1 "
                f"(got {prompt_tokens}, {output_tokens})"
            )
        total = prompt_tokens + output_tokens
        if total > p.max_model_len:
            raise PolicyError(
                f"sequence {seq_id!r}: {prompt_tokens} prompt + {output_tokens} output tokens "
                f"= {total} exceeds max_model_len {p.max_model_len}"
            )
        seq = _Seq(seq_id, prompt_tokens, output_tokens, priority, now, self._order)
        self._order += 1
        self._seqs[seq_id] = seq
        self._waiting.push(seq)
        self._n_waiting += 1

    def abort(self, seq_id: str) -> bool:
        """Drop a live sequence at once, freeing its blocks; no event is ever emitted for it.

        Returns ``False`` (and does nothing) if ``seq_id`` is unknown, finished or aborted.
        """
        s = self._seqs.pop(seq_id, None)
        if s is None:
            return False
        if s.state == _RUNNING:
            self._running.remove(s)
            self._kv.free(s.blocks)
        else:
            self._n_waiting -= 1  # its queue entry is skipped when it reaches the head
        s.state = _GONE
        return True

    def _pick_victim(self) -> int:
        """Index in the running list of the sequence to preempt (see module docstring)."""
        running = self._running
        if not self._priority:
            return len(running) - 1
        return max(range(len(running)), key=lambda i: running[i].rank())

    def _preempt(self, victim: _Seq) -> None:
        """Free ``victim``'s blocks and requeue it at the front for recompute."""
        self._kv.free(victim.blocks)
        victim.computed = 0
        victim.state = _WAITING
        victim.preemptions += 1
        self._waiting.push_front(victim)
        self._n_waiting += 1
        self.num_preemptions += 1

    def step(self, now: float) -> StepResult:
        """Schedule and run one iteration starting at ``now``; see the module docstring.

        ``now`` should not be earlier than the previous step's end (not checked: the caller
        owns the clock).  Returns a zero-length, event-free result when there is no work.
        """
        running = self._running
        if not running and not self._n_waiting:
            return StepResult(now, 0.0, [], 0, 0, 0)
        self._steps += 1
        stamp = self._steps
        kv = self._kv
        bs = self._profile.block_size
        budget = self._profile.max_num_batched_tokens
        scheduled: list[_Seq] = []
        preempted: list[_Seq] = []

        # 1. running sequences, in admission order
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            new = s.known - s.computed
            if new > budget:
                new = budget
            need = -(-(s.computed + new) // bs) - len(s.blocks)
            if need > 0:
                while need > kv.num_free:
                    j = self._pick_victim()
                    victim = running.pop(j)
                    if victim.scheduled_at == stamp:  # only possible in priority mode
                        budget += victim.new
                        scheduled.remove(victim)
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is s:
                        break
                    if j < i:
                        i -= 1
                if s.state != _RUNNING:
                    break
                kv.allocate(need, s.blocks)
            s.new = new
            s.scheduled_at = stamp
            scheduled.append(s)
            budget -= new
            i += 1

        # 2. waiting sequences, unless this step had to preempt
        if not preempted:
            waiting = self._waiting
            max_seqs = self._profile.max_num_seqs
            while budget > 0 and len(running) < max_seqs:
                s_or_none = waiting.peek()
                if s_or_none is None:
                    break
                s = s_or_none
                new = s.known if s.known < budget else budget
                need = -(-new // bs)
                if need > kv.num_free:
                    break
                waiting.pop()
                self._n_waiting -= 1
                s.state = _RUNNING
                running.append(s)
                kv.allocate(need, s.blocks)
                s.new = new
                s.scheduled_at = stamp
                scheduled.append(s)
                budget -= new

        # 3. duration from the batch composition, then advance and report
        prefill = decode = context = 0
        for s in scheduled:
            new = s.new
            after = s.computed + new
            if new == 1 and s.generated and after == s.known:
                decode += 1
            else:
                prefill += new
            context += after
        # No forward pass runs when nothing was scheduled (possible only in priority mode,
        # when the victims took every sequence scheduled so far and then the needy one).
        duration = self._profile.step_time(prefill, decode, context) if scheduled else 0.0
        t = now + duration
        events: list[EngineEvent] = [Preempted(v.seq_id, t) for v in preempted]
        finished = False
        token_events = self._token_events
        for s in scheduled:
            s.computed += s.new
            if s.computed == s.known:
                g = s.generated + 1
                s.generated = g
                s.known += 1
                if g == 1:
                    events.append(FirstToken(s.seq_id, t))
                if token_events:
                    events.append(Tokens(s.seq_id, 1, t))
                if g == s.output:
                    events.append(Finished(s.seq_id, t, s.prompt, g))
                    kv.free(s.blocks)
                    s.state = _GONE
                    del self._seqs[s.seq_id]
                    finished = True
        if finished:
            self._running = [s for s in running if s.state == _RUNNING]
        return StepResult(now, duration, events, prefill, decode, context)
