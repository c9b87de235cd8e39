"""The state of a :class:`~velvetrope.engine.batcher.Batcher`, and what changes it between
steps.

:class:`BatchState` holds the engine's live sequences (a
:class:`~velvetrope.engine.queues.SeqRecord` each, by id), the running ones in admission
order, the waiting queue (FCFS, or by ``(priority, arrival)``), the KV-block pool (with or
without prefix caching) and the cumulative counters.  It answers what is in the engine (the
properties, :meth:`~BatchState.seq_state`) and takes the commands that come between steps
(:meth:`~BatchState.add`, :meth:`~BatchState.abort`).  What one step does with this state
is the batcher's (:mod:`velvetrope.engine.batcher`, whose
:class:`~velvetrope.engine.batcher.Batcher` extends this class and is what callers
construct).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from velvetrope.engine.events import SeqState
from velvetrope.engine.kvcache import BlockAllocator
from velvetrope.engine.prefix_cache import PrefixCachingAllocator, block_hashes, expand_blocks
from velvetrope.engine.profile import EngineProfile
from velvetrope.engine.queues import GONE, RUNNING, FifoQueue, PriorityQueue, SeqRecord
from velvetrope.errors import PolicyError

__all__ = ["BatchState"]


class BatchState:
    """A :class:`~velvetrope.engine.batcher.Batcher`'s sequences, queues, KV blocks and
    counters (see the module docstring); constructed with the batcher's arguments."""

    __slots__ = (
        "_anchor",
        "_every",
        "_kv",
        "_n_waiting",
        "_order",
        "_pc",
        "_prefill_first",
        "_priority",
        "_profile",
        "_rng",
        "_running",
        "_seqs",
        "_steps",
        "_token_events",
        "_waiting",
        "num_preemptions",
        "prefix_cache_hits",
        "prefix_cache_queries",
        "spec_accepted_tokens",
        "spec_draft_tokens",
    )

    def __init__(
        self,
        profile: EngineProfile,
        *,
        priority: bool = False,
        token_events: bool = True,
        seed: int = 0,
    ) -> None:
        self._profile = profile
        self._prefill_first = profile.scheduler == "vllm-v0"
        self._every = profile.num_scheduler_steps
        self._anchor = 0
        self._priority = priority
        self._token_events = token_events
        self._pc: PrefixCachingAllocator | None = None
        self._kv: BlockAllocator | PrefixCachingAllocator
        if profile.enable_prefix_caching:
            self._pc = PrefixCachingAllocator(profile.num_gpu_blocks, profile.block_size)
            self._kv = self._pc
        else:
            self._kv = BlockAllocator(profile.num_gpu_blocks, profile.block_size)
        self._rng = random.Random(seed)
        self._seqs: dict[str, SeqRecord] = {}
        self._running: list[SeqRecord] = []
        self._waiting: FifoQueue | PriorityQueue = PriorityQueue() if priority else FifoQueue()
        self._n_waiting = 0
        self._order = 0
        self._steps = 0
        self.num_preemptions = 0
        """Preemptions since construction (cumulative)."""
        self.prefix_cache_queries = 0
        """Prompt tokens looked up in the prefix cache at admission (cumulative)."""
        self.prefix_cache_hits = 0
        """Prompt tokens found in the prefix cache at admission (cumulative)."""
        self.spec_draft_tokens = 0
        """Draft tokens proposed by speculative decoding (cumulative)."""
        self.spec_accepted_tokens = 0
        """Draft tokens accepted by speculative decoding (cumulative)."""

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
        """Calls to :meth:`~velvetrope.engine.batcher.Batcher.step` that found work, so far."""
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
    def prefix_caching(self) -> PrefixCachingAllocator | None:
        """The prefix-caching block pool, or ``None`` when prefix caching is off."""
        return self._pc

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
            status="running" if s.state == RUNNING else "waiting",
            prompt_tokens=s.prompt,
            output_tokens=s.output,
            generated_tokens=s.generated,
            computed_tokens=s.computed,
            block_ids=tuple(s.blocks),
            priority=s.priority,
            arrival=s.arrival,
            num_preemptions=s.preemptions,
            cached_tokens=s.cached,
        )

    # -- commands ----------------------------------------------------------------------

    def add(
        self,
        seq_id: str,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        priority: int = 0,
        *,
        prefix_id: str | None = None,
        prefix_tokens: int = 0,
        block_ids: Sequence[int] = (),
        block_tokens: int = 0,
    ) -> None:
        """Queue a sequence that arrived at ``now`` and will produce ``output_tokens`` tokens.

        ``priority`` matters only with ``priority=True`` (lower is served first; ties by
        arrival, then by call order).  ``prefix_id``/``prefix_tokens``: the first
        ``prefix_tokens`` prompt tokens are the shared prefix ``prefix_id`` (used only with
        prefix caching).  ``block_ids``/``block_tokens`` instead give the prompt's leading
        blocks of ``block_tokens`` tokens as chained hashes (a Mooncake trace's
        ``hash_ids``; :func:`~velvetrope.engine.prefix_cache.expand_blocks` maps them onto
        the engine's blocks; used only with prefix caching, and then they take precedence
        over ``prefix_id``).  Raises :class:`~velvetrope.errors.PolicyError` if either count is
        below 1, ``prompt + output > max_model_len``, ``prefix_tokens`` is not in
        ``[0, prompt_tokens]`` or ``seq_id`` is already live.  A sequence that passes always
        fits the KV cache on its own: a profile guarantees ``max_model_len <=
        kv_capacity_tokens()`` (as vLLM refuses to start otherwise), so the batcher can never
        livelock on one oversized sequence.
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
        if not 0 <= prefix_tokens <= prompt_tokens:
            raise PolicyError(
                f"sequence {seq_id!r}: prefix_tokens must be in [0, {prompt_tokens}] "
                f"(got {prefix_tokens})"
            )
        hashes: tuple[int, ...] = ()
        if self._pc is not None and block_ids:
            try:
                hashes = expand_blocks(
                    block_ids, block_tokens, p.block_size, prompt_tokens // p.block_size
                )
            except ValueError as e:
                raise PolicyError(f"sequence {seq_id!r}: {e}") from None
        elif self._pc is not None and prefix_id is not None:
            hashes = block_hashes(prefix_id, prefix_tokens // p.block_size)
        seq = SeqRecord(seq_id, prompt_tokens, output_tokens, priority, now, self._order, hashes)
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
        if s.state == RUNNING:
            self._running.remove(s)
            self._kv.free(s.blocks)
        else:
            self._n_waiting -= 1  # its queue entry is skipped when it reaches the head
        s.state = GONE
        return True
