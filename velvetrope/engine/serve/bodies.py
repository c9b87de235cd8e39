"""What ``velvetrope engine`` answers: OpenAI response bodies and stream chunks.

The text is deterministic filler: one common English word, with a leading space, per
generated token (:data:`FILLER_WORDS`, each exactly one ``cl100k_base`` token, so counting
the returned text with that encoding gives ``completion_tokens`` back), seeded by the
choice's output draw.

A :class:`Completion` is one validated request ready to answer, with one
:class:`~velvetrope.engine.outputs.OutputDecision` per choice (``n`` of them, indexes
``0 .. n-1``).  :func:`full_body` is the non-streaming answer; :class:`StreamWriter`
writes the chunks of a stream, OpenAI's format (vLLM's for completions: the last token's
chunk carries the finish reason): per choice its tokens and its finish, then once the
usage chunk (if asked for) and ``[DONE]``.  Usage counts the prompt once and the
completion tokens of every choice.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import orjson

from velvetrope.engine.outputs import OutputDecision
from velvetrope.openai.sse import DONE, json_event

__all__ = ["FILLER_WORDS", "Completion", "StreamWriter", "filler_seed", "filler_text", "full_body"]

# fmt: off
FILLER_WORDS: tuple[str, ...] = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " with", " as", " was",
    " on", " be", " at", " by", " this", " had", " not", " are", " but", " from", " or",
    " have", " an", " they", " which", " one", " you", " were", " her", " all", " she",
    " there", " would", " their", " we", " him", " been", " has", " when", " who", " will",
    " more", " no", " if", " out", " so", " said", " what", " up", " its", " about", " into",
    " than", " them", " can", " only", " other", " new", " some", " could", " time", " these",
    " two", " may", " then", " do", " first", " any", " my", " now", " such", " like", " our",
    " over", " man", " me", " even", " most", " made", " after", " also", " did", " many",
    " before", " must", " through", " back", " years", " where", " much", " your", " way",
    " well", " down", " should", " because", " each", " just", " those", " people", " how",
    " too", " little", " state", " good", " very", " make", " world", " still", " own", " see",
    " men", " work", " long", " get", " here", " between", " both", " life", " being", " under",
    " never", " day", " same", " another", " know", " while", " last", " might", " us",
    " great", " old", " year", " off", " come", " since", " against", " go", " came", " right",
    " used", " take", " three",
)
# fmt: on
"""The filler vocabulary: 145 words, each one ``cl100k_base`` token with its leading space."""

_WORD_JSON: tuple[bytes, ...] = tuple(orjson.dumps(w) for w in FILLER_WORDS)
_STRIDE = 7  # coprime with len(FILLER_WORDS): consecutive tokens cycle through every word


def _word_index(base: int, i: int) -> int:
    return (base + i * _STRIDE) % len(FILLER_WORDS)


def filler_text(base: int, start: int, n: int) -> str:
    """Tokens ``start .. start+n-1`` of the filler text seeded by ``base``."""
    return "".join(FILLER_WORDS[_word_index(base, i)] for i in range(start, start + n))


def filler_seed(decision: OutputDecision) -> int:
    """The seed of a choice's filler text (:func:`filler_text`'s ``base``)."""
    return int(decision.key_hash * 4294967296.0)


@dataclass(slots=True)
class Completion:
    """A validated request, ready to run: one output decision per choice."""

    chat: bool
    rid: str
    created: int
    prompt_tokens: int
    choices: tuple[OutputDecision, ...]
    stream: bool
    include_usage: bool
    priority: int
    arrived: float
    """Clock reading when the HTTP request reached the app."""
    request_id: str | None = None
    """The caller's id for it (the body's ``request_id``, vLLM's name), if any."""
    block_ids: tuple[int, ...] = ()
    """The prompt's leading blocks as chained hashes (``block_tokens`` tokens each), for
    the engine model's prefix cache (empty: prefix caching is off)."""
    block_tokens: int = 0
    cached_tokens: int | None = None
    """The prompt tokens found in the prefix cache (the first choice's), set once it ran
    with prefix caching on: the usage then carries ``prompt_tokens_details.cached_tokens``
    as vLLM's with ``--enable-prompt-tokens-details`` does (``None``: no details)."""

    @classmethod
    def new(
        cls,
        chat: bool,
        prompt_tokens: int,
        choices: tuple[OutputDecision, ...],
        stream: bool,
        include_usage: bool,
        priority: int,
        arrived: float,
    ) -> Completion:
        """A completion with a fresh OpenAI-style id (``chatcmpl-...`` / ``cmpl-...``)."""
        rid = ("chatcmpl-" if chat else "cmpl-") + os.urandom(12).hex()
        return cls(
            chat, rid, int(time.time()), prompt_tokens, choices, stream, include_usage,
            priority, arrived,
        )  # fmt: skip

    @property
    def completion_tokens(self) -> int:
        """Tokens generated over every choice."""
        return sum(d.tokens for d in self.choices)

    def usage(self) -> dict[str, Any]:
        """OpenAI's ``usage`` object: the prompt once, the completions of every choice, and
        the cached prompt tokens when known (:attr:`cached_tokens`)."""
        done = self.completion_tokens
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
        }
        if self.cached_tokens is not None:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return out


def full_body(c: Completion, model: str, ext: dict[str, float]) -> dict[str, Any]:
    """The non-streaming answer; ``ext`` is the ``velvetrope`` field (model predictions)."""
    choices: list[dict[str, Any]] = []
    for i, d in enumerate(c.choices):
        text = filler_text(filler_seed(d), 0, d.tokens)
        if c.chat:
            content: dict[str, Any] = {
                "message": {"role": "assistant", "content": text, "refusal": None}
            }
        else:
            content = {"text": text}
        choices.append({"index": i, **content, "logprobs": None, "finish_reason": d.finish_reason})
    return {
        "id": c.rid,
        "object": "chat.completion" if c.chat else "text_completion",
        "created": c.created,
        "model": model,
        "choices": choices,
        "usage": c.usage(),
        "velvetrope": ext,
    }


class StreamWriter:
    """Byte templates for one completion's SSE chunks, pre-built per choice."""

    __slots__ = ("_c", "_heads", "_model", "_obj", "_tail")

    def __init__(self, c: Completion, model_json: bytes) -> None:
        self._c = c
        self._model: str = orjson.loads(model_json)
        usage_null = b',"usage":null' if c.include_usage else b""
        obj, piece, close = (
            (b"chat.completion.chunk", b'"delta":{"content":', b"}")
            if c.chat
            else (b"text_completion", b'"text":', b"")
        )
        self._obj = obj.decode()
        prefix = (
            b'data: {"id":"' + c.rid.encode() + b'","object":"' + obj + b'","created":'
            + str(c.created).encode() + b',"model":' + model_json + b',"choices":[{"index":'
        )  # fmt: skip
        self._heads = tuple(prefix + str(i).encode() + b"," + piece for i in range(len(c.choices)))
        self._tail = close + b',"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"

    def _envelope(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        c = self._c
        d: dict[str, Any] = {
            "id": c.rid,
            "object": self._obj,
            "created": c.created,
            "model": self._model,
            "choices": choices,
        }
        d.update(extra)
        return json_event(d)

    def tokens(self, i: int, start: int, n: int, last: bool) -> bytes:
        """SSE bytes for tokens ``start .. start+n-1`` of choice ``i``: for a chat that
        starts, the role chunk first; with ``last``, the choice's finish."""
        c = self._c
        base = filler_seed(c.choices[i])
        head, tail = self._heads[i], self._tail
        usage_extra: dict[str, Any] = {"usage": None} if c.include_usage else {}
        parts: list[bytes] = []
        if c.chat and start == 0:
            role = {"role": "assistant", "content": ""}
            parts.append(
                self._envelope(
                    [{"index": i, "delta": role, "logprobs": None, "finish_reason": None}],
                    **usage_extra,
                )
            )
        end = start + n
        stop_at = end - 1 if (last and not c.chat) else end
        for k in range(start, stop_at):
            parts.append(head + _WORD_JSON[_word_index(base, k)] + tail)
        if last:
            reason = c.choices[i].finish_reason
            if c.chat:
                finish: dict[str, Any] = {"index": i, "delta": {}}
            else:  # completions: the last token's chunk carries the finish reason (vLLM)
                finish = {"index": i, "text": FILLER_WORDS[_word_index(base, end - 1)]}
            parts.append(
                self._envelope(
                    [{**finish, "logprobs": None, "finish_reason": reason}], **usage_extra
                )
            )
        return b"".join(parts)

    def end(self, ext: dict[str, float] | None) -> bytes:
        """The end of the stream: the usage chunk (if asked for) and ``[DONE]``."""
        if not self._c.include_usage:
            return DONE
        return self._envelope([], usage=self._c.usage(), velvetrope=ext or {}) + DONE
