"""Shared prompt prefixes for simulated workloads: a system prompt per application.

Traces record how long prompts are, not what they say.  :func:`with_system_prompts` gives
every request a shared prefix: the first ``tokens`` tokens of each prompt are the system
prompt of its application (by default its tenant), so requests of one application share
them and an engine with automatic prefix caching computes them once
(:mod:`velvetrope.engine.prefix_cache`).  ``velvetrope simulate --system-prompt N`` uses it
and turns prefix caching on in the profile.  Pure; returns new requests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from velvetrope.errors import PolicyError
from velvetrope.sim.trace_request import TraceRequest

__all__ = ["with_system_prompts"]


def with_system_prompts(
    requests: Sequence[TraceRequest],
    tokens: int,
    application: Callable[[TraceRequest], str] | None = None,
) -> list[TraceRequest]:
    """``requests`` whose first ``min(tokens, prompt_tokens)`` tokens are a shared prefix.

    ``application(request)`` names the prefix (default: the tenant); ``tokens == 0``
    removes every prefix.  Raises :class:`~velvetrope.errors.PolicyError` for a negative
    ``tokens``.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise PolicyError(f"system prompt length must be an int >= 0 (got {tokens!r})")
    name = application or (lambda r: r.tenant)
    if tokens == 0:
        return [dataclasses.replace(r, prefix_id=None, prefix_tokens=0) for r in requests]
    return [
        dataclasses.replace(
            r, prefix_id=f"system:{name(r)}", prefix_tokens=min(tokens, r.prompt_tokens)
        )
        for r in requests
    ]
