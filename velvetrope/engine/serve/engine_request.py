"""One sequence inside a :class:`~velvetrope.engine.serve.realtime.RealtimeEngine`, as its
HTTP handler sees it: :class:`EngineRequest`, the channel the handler awaits the tokens on
(:meth:`EngineRequest.next_tokens`) and the model's own timeline for the sequence, and
:class:`EngineClosed`, what the handler gets when the engine stops first.

The driver (:mod:`velvetrope.engine.serve.realtime`) is the producer side: it adds the
tokens, stamps the timeline and sets the state (:data:`ACTIVE`, :data:`FINISHED`,
:data:`ABORTED`, :data:`CLOSED`), then wakes the consumer.
"""

from __future__ import annotations

import asyncio
from typing import Final

from velvetrope.errors import UpstreamError

__all__ = ["ABORTED", "ACTIVE", "CLOSED", "FINISHED", "EngineClosed", "EngineRequest"]

ACTIVE: Final = 0
FINISHED: Final = 1
ABORTED: Final = 2
CLOSED: Final = 3
_STATE_NAMES: Final = ("active", "finished", "aborted", "closed")


class EngineClosed(UpstreamError):
    """The engine stopped (shut down or crashed) while the request was in it."""


class EngineRequest:
    """One sequence inside a :class:`~velvetrope.engine.serve.realtime.RealtimeEngine`: its
    token channel and its timeline.

    Model times (``*_model``) are model seconds on the engine's timeline; wall times
    (``*_wall``) are the engine clock's readings when the driver observed each moment.
    ``None`` until the moment happens.  The ``model_*_s`` properties are durations in
    *model* seconds; divide by the engine's speed for the wall-clock prediction.
    """

    __slots__ = (
        "_avail",
        "_error",
        "_state",
        "_waiter",
        "arrival_model",
        "arrival_wall",
        "cached_tokens",
        "finished_model",
        "finished_wall",
        "first_token_model",
        "first_token_wall",
        "output_tokens",
        "preemptions",
        "priority",
        "prompt_tokens",
        "scheduled_model",
        "scheduled_wall",
        "seq_id",
        "tokens_delivered",
    )

    def __init__(
        self,
        seq_id: str,
        prompt_tokens: int,
        output_tokens: int,
        priority: int,
        arrival_model: float,
        arrival_wall: float,
    ) -> None:
        self.seq_id = seq_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.priority = priority
        self.arrival_model = arrival_model
        self.arrival_wall = arrival_wall
        self.scheduled_model: float | None = None
        self.scheduled_wall: float | None = None
        self.first_token_model: float | None = None
        self.first_token_wall: float | None = None
        self.finished_model: float | None = None
        self.finished_wall: float | None = None
        self.tokens_delivered = 0
        """Tokens the engine produced for this request so far (delivered or not yet read)."""
        self.preemptions = 0
        self.cached_tokens = 0
        """Prompt tokens found in the prefix cache at its first admission (known once it
        finished; 0 without prefix caching)."""
        self._avail = 0
        self._state: int = ACTIVE
        self._waiter: asyncio.Future[None] | None = None
        self._error: str | None = None

    # -- state ---------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"active"``, ``"finished"``, ``"aborted"`` or ``"closed"`` (engine stopped)."""
        return _STATE_NAMES[self._state]

    @property
    def active(self) -> bool:
        """Still in the engine (neither finished, aborted nor closed)."""
        return self._state == ACTIVE

    @property
    def finished(self) -> bool:
        """The engine produced all ``output_tokens`` tokens."""
        return self._state == FINISHED

    @property
    def pending_tokens(self) -> int:
        """Tokens produced but not yet taken by :meth:`next_tokens`."""
        return self._avail

    @property
    def model_queue_s(self) -> float | None:
        """Model seconds from arrival to first being scheduled (vLLM's queue time)."""
        s = self.scheduled_model
        return None if s is None else s - self.arrival_model

    @property
    def model_ttft_s(self) -> float | None:
        """Model seconds from arrival to the first token."""
        f = self.first_token_model
        return None if f is None else f - self.arrival_model

    @property
    def model_e2e_s(self) -> float | None:
        """Model seconds from arrival to the last token."""
        f = self.finished_model
        return None if f is None else f - self.arrival_model

    # -- consumer side --------------------------------------------------------------------

    async def next_tokens(self) -> int:
        """Wait for tokens; return how many arrived since the last call (``>= 1``).

        Returns ``0`` once everything was taken and the request is finished or was
        aborted.  Raises :class:`EngineClosed` if the engine stopped first.  When it
        returns ``n > 0`` and :attr:`finished` is true, these were the last tokens.  One
        consumer at a time.
        """
        while self._avail == 0:
            if self._state != ACTIVE:
                if self._state == CLOSED:
                    raise EngineClosed(self._error or "the engine stopped")
                return 0
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        n = self._avail
        self._avail = 0
        return n

    # -- producer side (the driver) ---------------------------------------------------------

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __repr__(self) -> str:
        return (
            f"EngineRequest({self.seq_id!r}, prompt={self.prompt_tokens}, "
            f"output={self.output_tokens}, {self.state}, delivered={self.tokens_delivered})"
        )
