"""Endpoint kinds: what a job is, as the gateway, the simulator and the metrics name it.

:data:`KINDS` is the fixed set (metrics label by it, so a client can never grow it):
``chat``, ``completions``, ``responses``, ``messages`` (generating work), ``embeddings``,
``rerank`` (prompt-only work; a score request counts as ``rerank``) and ``passthrough`` (a
path the gateway passes with request-count admission).

Prompt-only work is sized once, here, for every driver (:func:`size_prompt_only`): its cost
is its input tokens, nothing is predicted or reserved for output (``predicted_output`` 0,
which is also what keeps it from teaching the output-length estimator), and its answer
comes whole (its first token is its end).  The gateway sizes an embeddings or rerank
request with it, the simulator a trace line of those kinds, so a what-if charges and
orders a backfill exactly as the gateway does.
"""

from __future__ import annotations

from typing import Final

from velvetrope.core.job import Job

__all__ = ["GENERATING", "KINDS", "PROMPT_ONLY", "SIMULATED", "size_prompt_only"]

GENERATING: Final = ("chat", "completions", "responses", "messages")
PROMPT_ONLY: Final = ("embeddings", "rerank")
KINDS: Final = (*GENERATING, *PROMPT_ONLY, "passthrough")
SIMULATED: Final = (*GENERATING, *PROMPT_ONLY)
"""The kinds a simulator trace may hold: a passed-through call is charged a fixed cost
whatever work it is, so a trace cannot say what it would cost an engine."""


def size_prompt_only(job: Job) -> Job:
    """Size ``job`` (not yet sized) as prompt-only work and return it: ``max_tokens`` 1 (the
    core requires a positive cap), ``predicted_output`` and ``reserved_output`` 0, ``cost``
    its ``prompt_tokens``, not ``streamed``.  The controller keeps a sized job's size."""
    job.max_tokens = 1
    job.predicted_output = 0
    job.reserved_output = 0
    job.cost = job.prompt_tokens
    job.streamed = False
    return job
