"""The output cap the reservation assumed, sent to the engine.

A request that names no output limit is reserved ``gateway.default_max_tokens`` per
completion at admission (:func:`~velvetrope.gateway.api.parse.job_for`).  Engines do not share
that assumption: vLLM's chat default is the rest of the context and llama.cpp's is
unlimited on both endpoints, so a reservation of 64 could be settled at 985 tokens.  The
gateway therefore **sends the cap the reservation assumed** (it does not reserve what the
engine could generate, which would be the whole context and would starve every bucket):
:func:`send_output_cap` writes the job's per-completion cap into the endpoint's own field
when the client named none.

* chat completions and completions: ``max_tokens`` (a chat that named
  ``max_completion_tokens`` already has its cap, so nothing is added; vLLM, SGLang and
  llama.cpp all read ``max_tokens`` on both endpoints);
* a completions request therefore gets ``default_max_tokens``, not OpenAI's and vLLM's
  default of 16: the cap is the gateway's, stated in one place (its config).

A degraded job's capped ``max_tokens`` is written by
:func:`~velvetrope.gateway.api.parse.degrade_body`; this runs after it and leaves that alone.
"""

from __future__ import annotations

import orjson

from velvetrope.core import Job
from velvetrope.gateway.api.parse import ParsedRequest

__all__ = ["CAP_FIELD", "send_output_cap"]

CAP_FIELD = "max_tokens"
"""The field that carries the cap on ``/v1/chat/completions`` and ``/v1/completions``."""


def send_output_cap(parsed: ParsedRequest, job: Job, field: str = CAP_FIELD) -> None:
    """Bound what the engine may generate for ``parsed`` by what ``job`` reserved: when
    the request named no cap, set ``field`` to the job's per-completion ``max_tokens``.

    Afterwards the upstream is always told a cap (the client's own, a degraded one, or the
    one set here).  The body's own bytes are kept when they can be: the member is spliced in
    front (:attr:`~velvetrope.gateway.api.parse.ParsedRequest.prepend`) unless the body was
    rewritten already or names ``field`` as ``null`` (then the body is written again)."""
    body = parsed.body
    if parsed.max_tokens is not None or body.get(field) is not None:
        return
    cap = job.max_tokens // max(1, job.n)
    if parsed.rewritten or field in body:
        parsed.rewritten = True
    else:
        parsed.prepend += b'"' + field.encode() + b'":' + orjson.dumps(cap) + b","
    body[field] = cap
