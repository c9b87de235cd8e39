"""A request's own latency objective, from its headers: a TTFT deadline and "do not queue".

``x-slo-ttft-ms: N`` (the name llm-d's SLO-aware routing reads) asks for the first token
within ``N`` milliseconds of arrival.  It can only tighten what the request's tier allows:
the job's deadline becomes the earlier of the two, so the request is refused at arrival
when its predicted wait already exceeds it, expired from the queue when it passes, and
ordered by it where the queue orders by deadline (``ordering: edf``).  A client cannot buy
a longer wait, nor a place ahead of another tenant (tiers and fairness decide that).

``x-velvetrope-do-not-queue: 1`` (Dynamo's ``do_not_queue``) asks to be refused rather
than wait: the request is dispatched if the pool can take it now, else answered 503
``wait_exceeds_slo`` at once, with ``Retry-After`` from the predicted drain.

A value that is not what these headers take is a 400 naming the header, never ignored.
"""

from __future__ import annotations

from typing import Final

from velvetrope.errors import RequestError

__all__ = ["DO_NOT_QUEUE_HEADER", "SLO_TTFT_HEADER", "request_deadline"]

SLO_TTFT_HEADER: Final = b"x-slo-ttft-ms"
DO_NOT_QUEUE_HEADER: Final = b"x-velvetrope-do-not-queue"
_MAX_MS: Final = 86_400_000  # a day: anything longer is no objective
_TRUE: Final = (b"1", b"true")
_FALSE: Final = (b"0", b"false")


def request_deadline(ttft_ms: bytes | None, do_not_queue: bytes | None, now: float) -> float | None:
    """The absolute deadline (on the controller's clock, ``now`` being the arrival) that the
    headers' values ask for, or ``None`` when they ask for none.  Raises
    :class:`~velvetrope.errors.RequestError` (400, ``invalid_header``) for a malformed one."""
    deadline: float | None = None
    if ttft_ms is not None:
        text = ttft_ms.strip()
        if not text.isdigit() or not 1 <= int(text) <= _MAX_MS:
            raise RequestError(
                f"header {SLO_TTFT_HEADER.decode()} must be a whole number of milliseconds "
                f"from 1 to {_MAX_MS}, got {ttft_ms.decode('latin-1')!r}",
                code="invalid_header",
                param=SLO_TTFT_HEADER.decode(),
            )
        deadline = now + int(text) / 1000.0
    if do_not_queue is not None:
        flag = do_not_queue.strip().lower()
        if flag in _TRUE:
            deadline = now
        elif flag not in _FALSE:
            raise RequestError(
                f"header {DO_NOT_QUEUE_HEADER.decode()} must be 1, 0, true or false, got "
                f"{do_not_queue.decode('latin-1')!r}",
                code="invalid_header",
                param=DO_NOT_QUEUE_HEADER.decode(),
            )
    return deadline
