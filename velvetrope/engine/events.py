"""What the engine model reports: per-step events and snapshots of sequences.

These are the values :class:`~velvetrope.engine.batcher.Batcher` returns; they live apart
from the scheduler so that consumers (the simulator, the engine server, the fits) can
import them without the scheduling code.  Timestamps are the caller's clock (seconds).

All are slotted dataclasses.  :class:`SeqState` is frozen; the per-step values (the events
and :class:`StepResult`) are not, because a simulation builds millions of them and a frozen
dataclass pays a generic ``object.__setattr__`` call per field to construct (about 3.5x the
time of a plain one).  They are values all the same: nothing mutates them once built, and
consumers must not either (they compare by value and are unhashable).  The per-step values
write their ``__init__`` out: this module is compiled (``setup.py``), and a dataclass's
generated ``__init__`` would stay Python code, run for every event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EngineEvent",
    "Finished",
    "FirstToken",
    "Preempted",
    "SeqState",
    "StepResult",
    "Tokens",
]


@dataclass(slots=True, init=False)
class FirstToken:
    """``seq_id`` produced its first output token at ``t`` (once per sequence, ever)."""

    seq_id: str
    t: float

    def __init__(self, seq_id: str, t: float) -> None:
        self.seq_id = seq_id
        self.t = t


@dataclass(slots=True, init=False)
class Tokens:
    """``seq_id`` produced ``n`` new output tokens in the step ending at ``t``.

    Includes the first token; summed over a sequence's life, ``n`` equals its
    ``output_tokens`` exactly (tokens recomputed after a preemption are not re-emitted).
    Without speculative decoding ``n == 1``; with it, a verification step emits the
    accepted draft tokens plus one, so ``n`` can be up to ``spec_tokens + 1``.
    """

    seq_id: str
    n: int
    t: float

    def __init__(self, seq_id: str, n: int, t: float) -> None:
        self.seq_id = seq_id
        self.n = n
        self.t = t


@dataclass(slots=True, init=False)
class Finished:
    """``seq_id`` produced its last token at ``t``; its blocks are already free.

    ``cached_tokens``: the prompt tokens it found in the prefix cache when it was first
    admitted (0 without prefix caching), what vLLM reports as
    ``usage.prompt_tokens_details.cached_tokens``."""

    seq_id: str
    t: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int

    def __init__(
        self, seq_id: str, t: float, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0
    ) -> None:
        self.seq_id = seq_id
        self.t = t
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.cached_tokens = cached_tokens


@dataclass(slots=True, init=False)
class Preempted:
    """``seq_id`` lost its KV cache in the step ending at ``t`` and waits to be recomputed."""

    seq_id: str
    t: float

    def __init__(self, seq_id: str, t: float) -> None:
        self.seq_id = seq_id
        self.t = t


EngineEvent = FirstToken | Tokens | Finished | Preempted


@dataclass(slots=True, init=False)
class StepResult:
    """One iteration: it starts at ``start``, lasts ``duration`` seconds, yields ``events``.

    ``prefill_tokens``, ``decode_seqs``, ``context_tokens`` and ``verify_tokens`` (draft
    tokens verified by speculative decoding) are the batch composition that ``duration``
    was computed from.  With no work: ``duration == 0.0``, no events.
    """

    start: float
    duration: float
    events: list[EngineEvent]
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int
    verify_tokens: int

    def __init__(
        self,
        start: float,
        duration: float,
        events: list[EngineEvent],
        prefill_tokens: int,
        decode_seqs: int,
        context_tokens: int,
        verify_tokens: int = 0,
    ) -> None:
        self.start = start
        self.duration = duration
        self.events = events
        self.prefill_tokens = prefill_tokens
        self.decode_seqs = decode_seqs
        self.context_tokens = context_tokens
        self.verify_tokens = verify_tokens

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
    cached_tokens: int = 0

    @property
    def num_blocks(self) -> int:
        """Blocks held (``len(block_ids)``)."""
        return len(self.block_ids)
