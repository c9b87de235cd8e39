"""``/tokenize`` and ``/detokenize`` of ``velvetrope engine``, in vLLM's shapes.

``POST /tokenize`` takes ``{"model"?, "prompt": str}`` or ``{"model"?, "messages": [...]}``
(``add_special_tokens``, ``add_generation_prompt`` and the like accepted and ignored) and
answers ``{"count": N, "max_model_len": M, "tokens": [N ids], "token_strs": null}``: ``N``
is what the engine's tokenizer counts for that prompt (the count its completions use), so a
client that tokenizes first learns the prompt tokens it will be charged.

The engine model has counts, not a vocabulary: the text is cut into ``N`` pieces of near
equal length and each piece's id is a hash of it (below 2**31).  ``POST /detokenize``
(``{"model"?, "tokens": [ints]}`` → ``{"prompt": str}``) joins the pieces of the ids this
engine handed out lately (the last :data:`REMEMBERED` pieces) and gives a filler word for
any other id, so a round trip of recent text returns it.  Mistakes are 400s naming their
``param``; another ``model`` than the served one is 404 ``model_not_found``.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Any

import orjson

from velvetrope.engine.serve.bodies import filler_text
from velvetrope.errors import RequestError
from velvetrope.openai.errors import invalid_value, model_not_found
from velvetrope.openai.tokenizer import Tokenizer
from velvetrope.serving.asgi import Receive, Send, respond

__all__ = ["REMEMBERED", "TokenizeServer", "piece_ids"]

REMEMBERED = 65_536
"""Pieces whose ids ``/detokenize`` can turn back into their text."""


def piece_ids(text: str, count: int) -> list[tuple[int, str]]:
    """``text`` cut into ``count`` pieces of near equal length (empty pieces when the text
    is shorter), each with its id: the CRC-32 of the piece, below 2**31."""
    n = len(text)
    out: list[tuple[int, str]] = []
    for i in range(count):
        piece = text[i * n // count : (i + 1) * n // count]
        out.append((zlib.crc32(piece.encode("utf-8", "surrogatepass")) & 0x7FFFFFFF, piece))
    return out


class TokenizeServer:
    """The two handlers, for an engine serving ``model`` with ``tokenizer``."""

    def __init__(self, model: str, tokenizer: Tokenizer, max_model_len: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._pieces: OrderedDict[int, str] = OrderedDict()

    def _body(self, raw: bytes) -> dict[str, Any]:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise RequestError("The body is not valid JSON.", code="invalid_json") from None
        if not isinstance(body, dict):
            raise RequestError("The body must be a JSON object.", code="invalid_type")
        model = body.get("model")
        if model is not None and model != self.model:
            raise model_not_found(str(model))
        return body

    async def tokenize(self, raw: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /tokenize``."""
        body = self._body(raw)
        if "messages" in body:
            msgs = body["messages"]
            if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
                raise invalid_value("messages", "'messages' must be a non-empty array of objects.")
            count = self.tokenizer.count_chat(msgs)
            text = "".join(str(m.get("content") or "") for m in msgs)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise invalid_value("prompt", "'prompt' must be a string (or send 'messages').")
            count, text = max(1, self.tokenizer.count(prompt)), prompt
        ids = piece_ids(text, count)
        for tid, piece in ids:
            self._pieces[tid] = piece
            self._pieces.move_to_end(tid)
        while len(self._pieces) > REMEMBERED:
            self._pieces.popitem(last=False)
        answer = {
            "count": count,
            "max_model_len": self.max_model_len,
            "tokens": [tid for tid, _ in ids],
            "token_strs": None,
        }
        await respond(send, 200, orjson.dumps(answer))

    async def detokenize(self, raw: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /detokenize``."""
        body = self._body(raw)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise invalid_value("tokens", "'tokens' must be an array of non-negative integers.")
        text = "".join(
            self._pieces[t] if t in self._pieces else filler_text(t, 0, 1) for t in tokens
        )
        await respond(send, 200, orjson.dumps({"prompt": text}))
