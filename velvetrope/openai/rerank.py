"""Rerank and score requests (``POST /v1/rerank``, ``/rerank``, ``/v1/score``), as vLLM
and llama.cpp serve them for cross-encoder and reranker models, once for both servers.

Both are prompt-only work: every (query, document) pair is one prefill of the two texts
together, nothing is generated.  :func:`parse_rerank` reads ``/v1/rerank`` and ``/rerank``
(``query`` a non-empty string; ``documents`` a non-empty array of strings or of objects
with a string ``text``; ``top_n`` an integer of at least 1), :func:`parse_score` reads
``/v1/score`` (``text_1`` and ``text_2`` each a string or a non-empty array of strings; two
arrays must have the same length, a string is paired with each text of the other), each
mistake a 400 naming its ``param``.  :attr:`PairsRequest.pairs` are the pairs, in order;
:func:`count_pair_tokens` counts each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from velvetrope.openai.errors import below_minimum, invalid_type, invalid_value, missing
from velvetrope.openai.request import load_body, model_of

__all__ = ["PairsRequest", "count_pair_tokens", "parse_rerank", "parse_score"]


@dataclass(frozen=True, slots=True)
class PairsRequest:
    """A rerank or score body that passed validation: its (query, document) ``pairs``."""

    body: dict[str, Any]
    model: str
    pairs: tuple[tuple[str, str], ...]
    top_n: int | None = None


def _texts(value: object, param: str) -> list[str]:
    """A string, or a non-empty array of strings (or of objects with a string ``text``)."""
    if value is None:
        raise missing(param)
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        if isinstance(value, list):
            raise invalid_value(param, f"'{param}' must not be empty.")
        raise invalid_type(param, "a string or an array of strings", value)
    out: list[str] = []
    for i, v in enumerate(value):
        text = v.get("text") if isinstance(v, dict) else v
        if not isinstance(text, str):
            raise invalid_type(f"{param}[{i}]", "a string", v)
        out.append(text)
    return out


def parse_rerank(raw: bytes) -> PairsRequest:
    """Validate ``raw`` as a rerank request (see the module docstring)."""
    body = load_body(raw)
    model = model_of(body)
    query = body.get("query")
    if query is None:
        raise missing("query")
    if not isinstance(query, str):
        raise invalid_type("query", "a string", query)
    docs = body.get("documents")
    if isinstance(docs, str):
        raise invalid_type("documents", "an array of strings", docs)
    documents = _texts(docs, "documents")
    top_n = body.get("top_n")
    if top_n is not None:
        if type(top_n) is not int:
            raise invalid_type("top_n", "an integer", top_n)
        if top_n < 1:
            raise below_minimum("top_n", top_n, 1)
    return PairsRequest(body, model, tuple((query, d) for d in documents), top_n)


def parse_score(raw: bytes) -> PairsRequest:
    """Validate ``raw`` as a score request (see the module docstring)."""
    body = load_body(raw)
    model = model_of(body)
    a, b = _texts(body.get("text_1"), "text_1"), _texts(body.get("text_2"), "text_2")
    if len(a) == 1:
        a = a * len(b)
    if len(a) != len(b):
        raise invalid_value("text_2", "'text_1' and 'text_2' must have the same length.")
    return PairsRequest(body, model, tuple(zip(a, b, strict=True)))


def count_pair_tokens(req: PairsRequest, count_text: Callable[[str], int]) -> list[int]:
    """The tokens of each pair (at least 1): its two texts, counted by ``count_text``."""
    return [max(1, count_text(q) + count_text(d)) for q, d in req.pairs]
