"""A sans-IO continuous batcher: vLLM's schedulers over a paged KV cache, stepped by time.

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

The scheduler is the profile's (``profile.scheduler``, see
:mod:`velvetrope.engine.profile`): every user of a profile gets the same behaviour.  The
steps below are ``vllm-v1``'s (chunked prefill, prompt chunks batched with decodes);
``vllm-v0`` differs in two places, described after them.

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

**vLLM V0** (``scheduler: vllm-v0``, no chunked prefill): a step that admits waiting
prompts runs only them, each whole (never split across steps unless it alone exceeds the
whole budget), and the running sequences wait; a step that admits none runs phase 1 as
above.  With ``num_scheduler_steps = k > 1`` (multi-step scheduling) admission is tried
only on every ``k``-th step counted from the last step that found nothing running (an
engine with nothing running admits at once).

**Automatic prefix caching** (``profile.enable_prefix_caching``): a sequence added with a
``prefix_id`` shares the full blocks of its first ``prefix_tokens`` prompt tokens with
every other sequence of that prefix (:mod:`velvetrope.engine.prefix_cache`).  When it is
admitted, the longest cached run of those blocks (never the whole prompt: at least one
token is computed, as in vLLM) is taken as already computed; those blocks are shared, not
allocated, and its prefill starts after them.  A block is registered in the cache once
computed in full, and freed blocks stay cached until the allocator evicts them (LRU).
:attr:`Batcher.prefix_cache_queries` and :attr:`Batcher.prefix_cache_hits` count prompt
tokens looked up and found, per admission (vLLM's ``vllm:prefix_cache_queries`` /
``vllm:prefix_cache_hits``).

**Speculative decoding** (``profile.spec_tokens = k > 0``): a decoding sequence schedules
``1 + d`` tokens, ``d = min(k, budget left - 1, tokens still to produce - 1)`` of them draft
tokens; each draft token is accepted with probability ``profile.spec_acceptance`` until the
first rejection (draws from ``random.Random(seed)``), and the step emits the accepted drafts
plus one token (:mod:`velvetrope.engine.speculative` gives the distribution).  Rejected
positions' blocks are released after the step.

Events are stamped with the end of the iteration (``now + duration``) and ordered:
all :class:`Preempted` first, then per scheduled sequence ``FirstToken`` (its first token
ever), ``Tokens`` and, when it reached ``output`` tokens, ``Finished``.  Every sequence
emits exactly one ``FirstToken`` and ``Tokens`` totalling exactly ``output`` tokens,
preempted or not (``Batcher(token_events=False)`` leaves out the ``Tokens`` events and
nothing else).  An aborted sequence emits nothing more.  Finished and aborted sequences are
forgotten at once (their id may be reused).

Invariants: used blocks never exceed ``num_gpu_blocks``; a running sequence holds exactly
``ceil(computed / block_size)`` blocks between steps, a waiting one none; with prefix
caching a block held by any sequence is never free, evicted or handed to another table.

Cost: ``step`` is O(scheduled sequences) plus O(blocks moved); there is one Python object
per event and no per-token allocation otherwise.
"""

from __future__ import annotations

from velvetrope.engine.batch_state import BatchState
from velvetrope.engine.events import (
    EngineEvent,
    Finished,
    FirstToken,
    Preempted,
    SeqState,
    StepResult,
    Tokens,
)
from velvetrope.engine.queues import GONE, RUNNING, WAITING, SeqRecord

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


class Batcher(BatchState):
    """A continuous-batching engine model over a paged KV cache; see the module docstring.

    ``priority=False`` is vLLM's ``fcfs`` scheduling policy, ``priority=True`` its
    ``priority`` policy.  ``token_events=False`` leaves out the :class:`Tokens` events
    (everything else is unchanged): a simulator that needs only first-token and finish
    times saves about 40% of :meth:`step`'s cost.  ``seed`` seeds the acceptance draws of
    speculative decoding (unused otherwise), so runs are reproducible.
    The scheduler (vLLM V1 or V0, multi-step or not) is the profile's.  Not thread-safe;
    all methods are synchronous and cheap.  The state it steps, its inspection and the
    commands between steps (:meth:`~BatchState.add`, :meth:`~BatchState.abort`) are
    :class:`~velvetrope.engine.batch_state.BatchState`'s.
    """

    __slots__ = ()

    def _pick_victim(self) -> int:
        """Index in the running list of the sequence to preempt (see module docstring)."""
        running = self._running
        if not self._priority:
            return len(running) - 1
        return max(range(len(running)), key=lambda i: running[i].rank())

    def _preempt(self, victim: SeqRecord) -> None:
        """Free ``victim``'s blocks and requeue it at the front for recompute."""
        self._kv.free(victim.blocks)
        victim.computed = 0
        victim.registered = 0
        victim.state = WAITING
        victim.preemptions += 1
        self._waiting.push_front(victim)
        self._n_waiting += 1
        self.num_preemptions += 1

    def _admit(self, s: SeqRecord, budget: int) -> int:
        """Admit the head waiting sequence if its first chunk fits; return the tokens it
        schedules (0: it does not fit, nothing changed).  Takes prefix-cache hits."""
        kv = self._kv
        bs = self._profile.block_size
        pc = self._pc
        if pc is None:  # no prefix caching: no hits, the whole first chunk is allocated
            new = min(s.known, budget)
            need = -(-new // bs)
            if need > kv.num_free:
                return 0
            kv.allocate(need, s.blocks)
            s.computed = s.cached = s.registered = 0
            return new
        hits: list[int] = []
        if s.hashes:
            hits = pc.lookup(s.hashes[: min(len(s.hashes), (s.known - 1) // bs)])
        hit_tokens = len(hits) * bs
        new = min(s.known - hit_tokens, budget)
        need = -(-(hit_tokens + new) // bs) - len(hits)
        if need + pc.reclaimable(hits) > pc.num_free:
            return 0
        pc.acquire(hits, s.blocks)
        self.prefix_cache_queries += s.known
        self.prefix_cache_hits += hit_tokens
        pc.allocate(need, s.blocks)
        s.computed = s.cached = hit_tokens
        if not s.preemptions:  # its first admission: what it reports (vLLM's num_cached_tokens)
            s.first_cached = hit_tokens
        s.registered = len(hits)
        return new

    def _verify(self, s: SeqRecord) -> int:
        """Accepted draft tokens of ``s``'s speculative step (leading successes)."""
        alpha = self._profile.spec_acceptance
        rnd = self._rng.random
        j = 0
        while j < s.spec and rnd() < alpha:
            j += 1
        self.spec_draft_tokens += s.spec
        self.spec_accepted_tokens += j
        return j

    def _schedule_running(
        self, stamp: int, budget: int, scheduled: list[SeqRecord], preempted: list[SeqRecord]
    ) -> int:
        """Phase 1: running sequences in admission order (preempting if blocks run out)."""
        running = self._running
        kv = self._kv
        bs = self._profile.block_size
        k = self._profile.spec_tokens
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            new = s.known - s.computed
            s.decoding = new == 1 and s.generated > 0
            s.spec = 0
            if s.decoding and k:
                spec = min(k, budget - 1, s.output - s.generated - 1)
                if spec > 0:
                    s.spec = spec
                    new += spec
            elif new > budget:
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
                if s.state != RUNNING:
                    break
                kv.allocate(need, s.blocks)
            s.new = new
            s.scheduled_at = stamp
            scheduled.append(s)
            budget -= new
            i += 1
        return budget

    def _schedule_waiting(self, stamp: int, budget: int, scheduled: list[SeqRecord]) -> int:
        """Phase 2: admit waiting sequences while seats, budget and blocks allow.

        In prefill-first mode a prompt is never split across steps (vLLM V0 without chunked
        prefill), unless it alone exceeds the whole budget.
        """
        running = self._running
        waiting = self._waiting
        max_seqs = self._profile.max_num_seqs
        whole = self._prefill_first
        while budget > 0 and len(running) < max_seqs:
            s = waiting.peek()
            if s is None:
                break
            if whole and s.known > budget and scheduled:
                break
            new = self._admit(s, budget)
            if not new:
                break
            waiting.pop()
            self._n_waiting -= 1
            s.state = RUNNING
            s.decoding = False
            s.spec = 0
            running.append(s)
            s.new = new
            s.scheduled_at = stamp
            scheduled.append(s)
            budget -= new
        return budget

    def step(self, now: float) -> StepResult:
        """Schedule and run one iteration starting at ``now``; see the module docstring.

        ``now`` should not be earlier than the previous step's end (not checked: the caller
        owns the clock).  Returns a zero-length, event-free result when there is no work.
        """
        running = self._running
        if not running and not self._n_waiting:
            return StepResult(now, 0.0, [], 0, 0, 0)
        if not running:
            self._anchor = self._steps
        admit = (self._steps - self._anchor) % self._every == 0
        self._steps += 1
        stamp = self._steps
        kv = self._kv
        profile = self._profile
        bs = profile.block_size
        budget = profile.max_num_batched_tokens
        scheduled: list[SeqRecord] = []
        preempted: list[SeqRecord] = []
        if self._prefill_first and admit and self._n_waiting:
            # vLLM V0: a step that can admit prompts runs them alone; decodes wait
            budget = self._schedule_waiting(stamp, budget, scheduled)
            if not scheduled:
                budget = self._schedule_running(stamp, budget, scheduled, preempted)
        else:
            # 1. running sequences, in admission order; 2. waiting ones, unless preempting
            budget = self._schedule_running(stamp, budget, scheduled, preempted)
            if admit and not preempted:
                budget = self._schedule_waiting(stamp, budget, scheduled)

        # 3. duration from the batch composition, then advance and report
        prefill = decode = context = verify = 0
        for s in scheduled:
            if s.decoding:
                decode += 1
                verify += s.spec
            else:
                prefill += s.new
            context += s.computed + s.new
        # No forward pass runs when nothing was scheduled (possible only in priority mode,
        # when the victims took every sequence scheduled so far and then the needy one).
        duration = profile.step_time(prefill, decode, context, verify) if scheduled else 0.0
        t = now + duration
        events: list[EngineEvent] = [Preempted(v.seq_id, t) for v in preempted] if preempted else []
        finished = False
        token_events = self._token_events
        pc = self._pc
        for s in scheduled:
            if s.spec:
                accepted = self._verify(s)
                emitted = accepted + 1
                s.computed = s.known + accepted
                kv.release_tail(s.blocks, -(-s.computed // bs))
            else:
                s.computed += s.new
                emitted = 1 if s.computed == s.known else 0
            if pc is not None and s.registered < len(s.hashes):
                full = min(len(s.hashes), s.computed // bs)
                for b in range(s.registered, full):
                    pc.register(s.blocks[b], s.hashes[b])
                s.registered = max(s.registered, full)
            if emitted:
                g = s.generated + emitted
                s.generated = g
                s.known += emitted
                if g == emitted:
                    events.append(FirstToken(s.seq_id, t))
                if token_events:
                    events.append(Tokens(s.seq_id, emitted, t))
                if g == s.output:
                    events.append(Finished(s.seq_id, t, s.prompt, g, s.first_cached))
                    kv.free(s.blocks)
                    s.state = GONE
                    del self._seqs[s.seq_id]
                    finished = True
        if finished:
            self._running = [s for s in running if s.state == RUNNING]
        return StepResult(now, duration, events, prefill, decode, context, verify)
