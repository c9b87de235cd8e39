"""The requests an engine server holds, and when: a live count, its peak, and a journal.

A request is *held* from the moment its HTTP request reached the server
(:attr:`~velvetrope.engine.serve.bodies.Completion.arrived`) until the engine is done with
it.  Only requests submitted for generation count (a request refused with a 4xx never is).
"Done" is:

* for a request whose every choice finished: the moment the last one finished, as the
  driver delivered it, which is before the handler writes its last bytes (so before any
  client of the engine can have seen the end of the response);
* otherwise (aborted because the client went away, closed because the engine stopped): the
  moment its handler let it go.

:class:`RequestLoad` counts them: :attr:`~RequestLoad.in_flight` and
:attr:`~RequestLoad.peak` (the most held at once since the server started, counted when a
request is submitted and when its handler lets it go) feed the gauges
``velvetrope_engine_requests_in_flight`` and ``velvetrope_engine_requests_peak``
(:mod:`velvetrope.engine.serve.metrics`).  With a ``journal`` path it also appends one JSON
line when a request starts and one when it ends, each written through at once (so an engine
killed with SIGKILL leaves every line up to its death)::

    {"ev": "start", "id": ID, "request_id": RID, "t": T, "prompt": P, "stream": S}
    {"ev": "end", "id": ID, "t": T, "state": STATE, "prefilled": N, "generated": G,
     "taken": K}

``id`` is the response's id; ``request_id`` the body's ``request_id`` member (vLLM's
name for a caller's request id) when it is a string, else ``null``; ``t`` seconds on the
server's clock (:class:`~velvetrope.clock.SystemClock`, :func:`time.monotonic`, which on
Linux every process of a machine shares), the start being the arrival and the end the
moment defined above; ``prompt`` the prompt tokens of one choice; ``state`` ``finished``,
``aborted`` or ``closed``; ``prefilled`` the prompt tokens that
``vllm:prompt_tokens_total`` counted for it (a choice's prompt once it produced its first
token); ``generated`` the tokens it produced (what ``vllm:generation_tokens_total``
counted); ``taken`` those its handler took to write out (the rest were produced after the
client had gone).  So, for an engine that was not killed, the journal's ``prefilled`` and
``generated`` sum to the two counters exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Protocol

import orjson

from velvetrope.clock import Clock

__all__ = ["LoadStats", "Progress", "RequestLoad"]


class LoadStats(Protocol):
    """What the load gauges read at scrape time."""

    @property
    def in_flight(self) -> int: ...
    @property
    def peak(self) -> int: ...


class Progress(Protocol):
    """What the journal reads of one choice when its request ends (an
    :class:`~velvetrope.engine.serve.engine_request.EngineRequest`)."""

    @property
    def finished(self) -> bool: ...
    @property
    def finished_wall(self) -> float | None: ...
    @property
    def first_token_wall(self) -> float | None: ...
    @property
    def tokens_delivered(self) -> int: ...
    @property
    def pending_tokens(self) -> int: ...
    @property
    def state(self) -> str: ...


class RequestLoad:
    """The requests held (see the module docstring); ``journal``: a path to append to."""

    __slots__ = ("_clock", "_file", "in_flight", "peak")

    def __init__(self, clock: Clock, journal: str | None = None) -> None:
        self._clock = clock
        self.in_flight = 0
        """Requests held now."""
        self.peak = 0
        """The most requests held at once since the server started."""
        self._file: IO[bytes] | None = None
        if journal is not None:
            self._file = open(journal, "ab", buffering=0)  # noqa: SIM115 (closed in close())

    def begin(
        self, rid: str, request_id: str | None, arrived: float, prompt: int, stream: bool
    ) -> None:
        """A request was submitted for generation (it reached the server at ``arrived``)."""
        self.in_flight += 1
        if self.in_flight > self.peak:
            self.peak = self.in_flight
        if self._file is not None:
            line = {
                "ev": "start",
                "id": rid,
                "request_id": request_id,
                "t": arrived,
                "prompt": prompt,
                "stream": stream,
            }
            self._file.write(orjson.dumps(line) + b"\n")

    def end(self, rid: str, prompt: int, choices: Sequence[Progress]) -> None:
        """The handler let the request go, its ``choices`` (sequences, each of ``prompt``
        tokens) no longer active: finished, aborted or closed (the journal's ``state`` is
        ``finished`` if every one finished, else ``closed`` if one was, else ``aborted``)."""
        self.in_flight -= 1
        if self._file is None:
            return
        at = self._clock.now()
        ends = [c.finished_wall for c in choices]
        if all(c.finished for c in choices):
            state = "finished"
            at = max((e for e in ends if e is not None), default=at)
        elif any(c.state == "closed" for c in choices):
            state = "closed"
        else:
            state = "aborted"
        line = {
            "ev": "end",
            "id": rid,
            "t": at,
            "state": state,
            "prefilled": sum(prompt for c in choices if c.first_token_wall is not None),
            "generated": sum(c.tokens_delivered for c in choices),
            "taken": sum(c.tokens_delivered - c.pending_tokens for c in choices),
        }
        self._file.write(orjson.dumps(line) + b"\n")

    def end_instant(self, rid: str, prompt: int, tokens: int) -> None:
        """An instant-mode request was written whole: ``prompt`` tokens prefilled and
        ``tokens`` generated over its choices.  It ends now."""
        self.in_flight -= 1
        if self._file is not None:
            line = {
                "ev": "end",
                "id": rid,
                "t": self._clock.now(),
                "state": "finished",
                "prefilled": prompt,
                "generated": tokens,
                "taken": tokens,
            }
            self._file.write(orjson.dumps(line) + b"\n")

    def close(self) -> None:
        """Close the journal (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
