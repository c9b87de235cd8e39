"""The endpoints the gateway admits, and what each costs at admission.

=========================  ==========================================  ===================
Path                       Admission cost (tokens reserved)            Settled from
=========================  ==========================================  ===================
``/v1/chat/completions``   prompt + ``max_completion_tokens`` or       ``usage.prompt_tokens``
                           ``max_tokens`` (else ``default_max_tokens``,   + ``completion_tokens``
                           sent upstream), times ``n``
``/v1/completions``        the same, over every prompt of a batch      the same
``/v1/embeddings``         the input tokens (every input), nothing     ``usage.prompt_tokens``
                           for output
``/v1/rerank``, ``/rerank``  each (query, document) pair's tokens,      ``usage.prompt_tokens``
``/v1/score``              nothing for output                            (else ``total_tokens``)
``/v1/responses``          input, instructions and tools +             ``usage.input_tokens``
                           ``max_output_tokens`` (else                   + ``output_tokens``
                           ``default_max_tokens``, sent upstream)
``/v1/messages``           system, messages and tools + ``max_tokens``   the same (a stream's
                           (Anthropic's API requires it)                  ``message_delta``)
=========================  ==========================================  ===================

Every admitted endpoint goes through the same door: the tenant's API key, its tier and
buckets, the pool's queue (ordered with every other request of the pool: an embedding
backfill of a batch tenant waits behind an interactive chat like any batch request), the
least-loaded live upstream, settlement from the engine's reported usage.

A prompt-only request (embeddings, rerank, score) is a job of ``max_tokens`` 1 whose size
is set here, before the controller sizes it: no output is predicted or reserved, its cost
is its input (:func:`prompt_only_job`).  Its body goes upstream unchanged but for the fields the
gateway owns (a client's ``priority``; a degraded job's fallback ``model``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import orjson

from velvetrope.core import Job, Usage
from velvetrope.core.kinds import size_prompt_only
from velvetrope.core.routing import FALLBACK_POOL, MAX_TOKENS
from velvetrope.gateway.api.messages import MessagesRelay, messages_usage, parse_messages_request
from velvetrope.gateway.api.output_cap import send_output_cap
from velvetrope.gateway.api.parse import (
    Kind,
    ParsedRequest,
    degrade_body,
    expected_tokens,
    job_for,
    parse_request,
)
from velvetrope.gateway.api.responses import (
    ResponsesRelay,
    parse_responses_request,
    responses_usage,
)
from velvetrope.gateway.upstream.proxy import Events
from velvetrope.gateway.upstream.relay import relay_events
from velvetrope.openai.embeddings import count_input_tokens, parse_embeddings
from velvetrope.openai.rerank import count_pair_tokens, parse_rerank, parse_score
from velvetrope.openai.tokenizer import Tokenizer

__all__ = [
    "COUNT_TOKENS",
    "ENDPOINTS",
    "Endpoint",
    "degrade_prompt_only",
    "events_for",
    "make_job",
    "parse_prompt_only",
    "prompt_only_job",
    "prompt_usage",
    "read_request",
    "shape_body",
]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One admitted endpoint: its ``name`` (``chat``, ``completions``, ``embeddings``,
    ``responses``), the ``upstream`` path it is forwarded to, whether it is ``prompt_only``
    work (no output reserved, settled from the prompt tokens the engine reports), and the
    field that carries its output cap
    (:func:`~velvetrope.gateway.api.output_cap.send_output_cap`)."""

    name: str
    upstream: str
    prompt_only: bool = False
    cap_field: str = "max_tokens"
    anthropic: bool = False
    """Anthropic's API: errors in its shape (:mod:`velvetrope.openai.anthropic`)."""

    @property
    def job_kind(self) -> str:
        """The job's endpoint kind (:attr:`~velvetrope.core.Job.kind`): the name, with a
        score counted as ``rerank`` (metrics keep a fixed set of kinds)."""
        return "rerank" if self.name == "score" else self.name

    @property
    def kind(self) -> Kind:
        """The completion kind of a generating endpoint (``chat`` or ``completions``)."""
        return "chat" if self.name == "chat" else "completions"


ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint("chat", "/v1/chat/completions"),
    "/v1/completions": Endpoint("completions", "/v1/completions"),
    "/v1/embeddings": Endpoint("embeddings", "/v1/embeddings", prompt_only=True),
    "/v1/rerank": Endpoint("rerank", "/v1/rerank", prompt_only=True),
    "/rerank": Endpoint("rerank", "/rerank", prompt_only=True),
    "/v1/score": Endpoint("score", "/v1/score", prompt_only=True),
    "/v1/responses": Endpoint("responses", "/v1/responses", cap_field="max_output_tokens"),
    "/v1/messages": Endpoint("messages", "/v1/messages", anthropic=True),
}
"""The admitted endpoints by the path a client sends to."""

COUNT_TOKENS = Endpoint("count_tokens", "/v1/messages/count_tokens", anthropic=True)
"""Anthropic's token count: authenticated and forwarded, not admitted (nothing generated)."""


def read_request(
    endpoint: Endpoint, raw: bytes, tok: Tokenizer, max_tokens_limit: int, strict: bool
) -> ParsedRequest:
    """Validate and count ``raw`` as a request to ``endpoint`` (a 400
    :class:`~velvetrope.errors.RequestError` naming its ``param`` if not valid);
    ``strict``: unknown top-level keys are refused."""
    if endpoint.prompt_only:
        return parse_prompt_only(raw, tok.count, name=endpoint.name, strict=strict)
    if endpoint.name == "responses":
        return parse_responses_request(
            raw, tok.count, max_tokens_limit=max_tokens_limit, known_keys_only=strict
        )
    if endpoint.anthropic:
        count_only = endpoint is COUNT_TOKENS
        return parse_messages_request(
            raw, tok.count, max_tokens_limit=max_tokens_limit, known_keys_only=strict,
            count_only=count_only,
        )  # fmt: skip
    return parse_request(
        raw,
        endpoint.kind,
        max_tokens_limit=max_tokens_limit,
        count_text=tok.count,
        count_chat=tok.count_chat,
        known_keys_only=strict,
    )


def make_job(
    endpoint: Endpoint,
    parsed: ParsedRequest,
    job_id: str,
    tenant: str,
    tier: str,
    default_max_tokens: int,
    expected_header: bytes | None,
) -> Job:
    """The admission job of ``parsed`` (:func:`prompt_only_job` or
    :func:`~velvetrope.gateway.api.parse.job_for`), its ``kind`` the endpoint's."""
    if endpoint.prompt_only:
        job = prompt_only_job(parsed, job_id, tenant, tier)
    else:
        expected = expected_tokens(expected_header)
        job = job_for(parsed, job_id, tenant, tier, default_max_tokens, expected)
    job.kind = endpoint.job_kind
    return job


def shape_body(endpoint: Endpoint, parsed: ParsedRequest, job: Job) -> None:
    """The upstream body of an admitted ``job``: a degraded job's cap or fallback model,
    and the output cap its reservation assumed when the request named none."""
    if endpoint.prompt_only:
        degrade_prompt_only(parsed, job)
        return
    if endpoint.cap_field == "max_tokens":
        degrade_body(parsed, job)
    else:  # the Responses API: its own cap field
        if MAX_TOKENS in job.degraded:
            parsed.body[endpoint.cap_field] = job.max_tokens
            parsed.rewritten = True
        degrade_prompt_only(parsed, job)  # the fallback model
    send_output_cap(parsed, job, endpoint.cap_field)


def read_usage(endpoint: Endpoint, body: bytes | None) -> Usage | None:
    """The usage of a whole answer from an endpoint whose usage is not OpenAI's
    ``prompt_tokens``/``completion_tokens`` pair (embeddings, Responses); ``None`` for the
    others (the proxy read theirs) or when absent."""
    if endpoint.prompt_only:
        return prompt_usage(body)
    if endpoint.name == "responses":
        return responses_usage(body)[0]
    if endpoint.anthropic:
        return messages_usage(body)
    return None


def events_for(endpoint: Endpoint) -> Events:
    """What reads a stream of ``endpoint`` (one per request when it keeps state)."""
    if endpoint.name == "responses":
        return ResponsesRelay()
    if endpoint.anthropic:
        return MessagesRelay()
    return relay_events


def parse_prompt_only(
    raw: bytes, count_text: Callable[[str], int], *, name: str = "embeddings", strict: bool = False
) -> ParsedRequest:
    """Validate ``raw`` as a ``name`` request (``embeddings``:
    :func:`~velvetrope.openai.embeddings.parse_embeddings`; ``rerank`` or ``score``:
    :mod:`velvetrope.openai.rerank`; a 400 naming its ``param`` if not) and count its input
    tokens (at least 1 per input or pair).  A client's ``priority`` is removed, as on the
    completion endpoints (priority comes from the tenant's config).  The parsed request's
    ``kind`` is only a label here: nothing past parsing reads it."""
    if name == "embeddings":
        req = parse_embeddings(raw, known_keys_only=strict)
        model, body, tokens = req.model, req.body, sum(count_input_tokens(req, count_text))
    else:
        pairs = parse_rerank(raw) if name == "rerank" else parse_score(raw)
        model, body, tokens = pairs.model, pairs.body, sum(count_pair_tokens(pairs, count_text))
    rewritten = "priority" in body
    if rewritten:
        del body["priority"]
    return ParsedRequest(
        kind=cast(Kind, name),
        model=model,
        stream=False,
        client_wants_usage=True,
        max_tokens=None,
        prompt_tokens=tokens,
        raw=raw,
        body=body,
        rewritten=rewritten,
    )


def prompt_only_job(parsed: ParsedRequest, job_id: str, tenant: str, tier: str) -> Job:
    """The job of a prompt-only ``parsed`` for ``tenant`` in ``tier``, sized by the core's
    rule (:func:`~velvetrope.core.kinds.size_prompt_only`: cost = its input tokens, nothing
    predicted or reserved for output), which the controller keeps and the simulator shares."""
    job = Job(job_id, tenant, tier, parsed.prompt_tokens, 1, model=parsed.model)
    return size_prompt_only(job)


def degrade_prompt_only(parsed: ParsedRequest, job: Job) -> None:
    """Rewrite a degraded prompt-only job's body: only a fallback ``model`` applies (there is
    no output to cap)."""
    if FALLBACK_POOL in job.degraded and job.model is not None:
        parsed.body["model"] = job.model
        parsed.rewritten = True


def prompt_usage(body: bytes | None) -> Usage | None:
    """The usage of a prompt-only answer: its ``usage.prompt_tokens`` (vLLM's rerank
    reports only ``total_tokens``: then that) and no output; ``None`` when the body
    reports neither."""
    if not body:
        return None
    try:
        u = orjson.loads(body)["usage"]
        p = u["prompt_tokens"] if "prompt_tokens" in u else u["total_tokens"]
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return None
    if type(p) is not int or p < 0:
        return None
    return Usage(p, 0)
