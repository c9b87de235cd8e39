"""The gateway's reading of a request: OpenAI's validation, then what admission needs.

Validation is :mod:`velvetrope.openai.request`'s (the same checks, codes and messages as
``velvetrope engine``), with the gateway's additions: ``max_tokens`` is capped by the
configured limit, and in strict mode (``gateway.unknown_parameters: refuse``) unknown
top-level keys are refused (``unknown_parameter``).  By default a key the gateway does not
read (the OpenAI SDK's newer fields, an engine's extras) goes to the engine untouched.
Every defect of a field the gateway reads is a 400 :class:`~velvetrope.errors.RequestError`
naming its ``param``.

The upstream sees the body unchanged except where the gateway must change it: a streaming
request always asks for ``stream_options.include_usage`` (the gateway strips the extra
chunk if the client did not ask for it), and a client's own ``priority`` field is removed
(priority comes only from the tenant's config: a pool with ``engine_priority`` sends its
job's tier band, :func:`set_engine_priority`).

:func:`job_for` makes the admission core's :class:`~velvetrope.core.job.Job` of a parsed
request.  This module imports nothing outside the OpenAI protocol and the core, so
``setup.py`` compiles it with mypyc: it runs for every request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from velvetrope.core.job import Job
from velvetrope.core.routing import FALLBACK_POOL, MAX_TOKENS
from velvetrope.openai.request import Kind, count_prompt_tokens, parse, template_fingerprint

__all__ = [
    "EXPECTED_TOKENS_HEADER",
    "Kind",
    "ParsedRequest",
    "degrade_body",
    "expected_tokens",
    "job_for",
    "parse_request",
    "set_engine_priority",
]

EXPECTED_TOKENS_HEADER = b"x-velvetrope-expected-tokens"
"""A client's own expected output length; used only for tenants with
``trust_expected_output``."""


def expected_tokens(value: bytes | None) -> int | None:
    """The header's value as a positive integer, ``None`` if absent or not one."""
    if value is None or not value.strip().isdigit():
        return None
    n = int(value)
    return n if n >= 1 else None


@dataclass(slots=True, init=False)
class ParsedRequest:
    """A validated request.  ``body`` is what goes upstream (see :attr:`upstream_body`);
    ``n`` is how many completions it asks for (each up to ``max_tokens``).  (Its
    ``__init__`` is written out: a dataclass's generated one would stay Python code in this
    compiled module.)"""

    kind: Kind
    model: str
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None
    prompt_tokens: int
    raw: bytes
    body: dict[str, Any]
    rewritten: bool
    n: int
    template: str | None  # the prompt template's fingerprint (length prediction)
    prepend: bytes  # members to add at the start of ``raw`` (``body`` has them)

    def __init__(
        self,
        kind: Kind,
        model: str,
        stream: bool,
        client_wants_usage: bool,
        max_tokens: int | None,
        prompt_tokens: int,
        raw: bytes,
        body: dict[str, Any],
        rewritten: bool,
        n: int = 1,
        template: str | None = None,
        prepend: bytes = b"",
    ) -> None:
        self.kind = kind
        self.model = model
        self.stream = stream
        self.client_wants_usage = client_wants_usage
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.raw = raw
        self.body = body
        self.rewritten = rewritten
        self.n = n
        self.template = template
        self.prepend = prepend

    def upstream_body(self) -> bytes:
        """The bytes to send upstream: the client's own, with :attr:`prepend`'s members
        spliced in first, unless the gateway changed more (then ``body`` serialized)."""
        if self.rewritten:
            return orjson.dumps(self.body)
        if self.prepend:
            raw = self.raw
            at = raw.index(b"{") + 1  # a valid request: an object with members
            return raw[:at] + self.prepend + raw[at:]
        return self.raw


_ASK_USAGE = b'"stream_options":{"include_usage":true},'


def parse_request(
    raw: bytes,
    kind: Kind,
    *,
    max_tokens_limit: int,
    count_text: Callable[[str], int],
    count_chat: Callable[[Sequence[Mapping[str, Any]]], int] | None = None,
    known_keys_only: bool = False,
) -> ParsedRequest:
    """Validate ``raw`` as a ``kind`` request and count its prompt tokens
    (:func:`~velvetrope.openai.request.count_prompt_tokens`); ``known_keys_only`` (strict
    mode) refuses top-level keys outside OpenAI's and vLLM's (else they pass unread)."""
    req = parse(raw, kind, known_keys_only=known_keys_only, max_tokens_limit=max_tokens_limit)
    body = req.body
    rewritten = False
    if "priority" in body:
        del body["priority"]
        rewritten = True
    prepend = b""
    if req.stream and not req.include_usage:
        absent = "stream_options" not in body
        opts = body.get("stream_options")
        body["stream_options"] = {**(opts or {}), "include_usage": True}
        if absent:
            prepend = _ASK_USAGE  # no such member yet: add it to the client's own bytes
        else:
            rewritten = True
    return ParsedRequest(
        kind=kind,
        model=req.model,
        stream=req.stream,
        client_wants_usage=req.include_usage,
        max_tokens=req.max_tokens,
        prompt_tokens=count_prompt_tokens(req, count_text, count_chat),
        raw=raw,
        body=body,
        rewritten=rewritten,
        prepend=prepend,
        n=req.n,
        template=template_fingerprint(req),
    )


def job_for(
    parsed: ParsedRequest,
    job_id: str,
    tenant: str,
    tier: str,
    default_max_tokens: int,
    expected_output: int | None,
) -> Job:
    """The job of ``parsed`` for ``tenant`` in ``tier``: its prompt tokens, model, template
    and streaming, and a ``max_tokens`` that sums the ``n`` completions it asks for, each up
    to its own ``max_tokens`` or else ``default_max_tokens`` (the usage reports their sum)."""
    return Job(
        id=job_id,
        tenant=tenant,
        tier=tier,
        prompt_tokens=parsed.prompt_tokens,
        max_tokens=(parsed.max_tokens or default_max_tokens) * parsed.n,
        model=parsed.model,
        n=parsed.n,
        template=parsed.template,  # length prediction and the adaptive limit
        streamed=parsed.stream,
        expected_output=expected_output,
    )


def degrade_body(parsed: ParsedRequest, job: Job) -> None:
    """Rewrite ``parsed``'s upstream body for a degraded ``job``: the capped
    ``max_tokens`` per completion (``max_completion_tokens`` when a chat request used it)
    and the fallback model.  A job that was not degraded leaves the body alone."""
    if not job.degraded:
        return
    body = parsed.body
    if MAX_TOKENS in job.degraded:
        cap = job.max_tokens // max(1, job.n)
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        body[key] = cap
        if key == "max_completion_tokens" and "max_tokens" in body:
            body["max_tokens"] = cap
    if FALLBACK_POOL in job.degraded and job.model is not None:
        body["model"] = job.model
    parsed.rewritten = True


def set_engine_priority(parsed: ParsedRequest, priority: int | None) -> None:
    """Send ``parsed`` upstream with the engine's ``priority`` field set to ``priority``,
    or without the field (``None``): see
    :mod:`~velvetrope.gateway.upstream.priority_forwarding`."""
    body = parsed.body
    if priority is None:
        if "priority" in body:
            del body["priority"]
            parsed.rewritten = True
    elif body.get("priority") != priority:
        body["priority"] = priority
        parsed.rewritten = True
