"""``/v1/rerank``, ``/rerank`` and ``/v1/score`` of ``velvetrope engine``: a reranker's or
cross-encoder's work in the engine model, prompt-only like embeddings.

Each (query, document) pair is one sequence that the batcher prefills (the two texts,
counted with the engine's tokenizer) and that ends with its first token, as
:mod:`.embeddings` runs an input.  The bodies are validated by
:mod:`velvetrope.openai.rerank` (the gateway's checks); ``model`` must be the served name.
Scores are deterministic in ``[0, 1)`` (:func:`pair_score`).

``/v1/rerank`` and ``/rerank`` answer vLLM's and Jina's shape: ``{"id", "model", "usage":
{"prompt_tokens", "total_tokens"}, "results": [{"index", "relevance_score", "document":
{"text"}}]}``, most relevant first, the ``top_n`` first when given.  ``/v1/score`` answers
``{"id", "object": "list", "model", "data": [{"index", "object": "score", "score"}],
"usage": {"prompt_tokens", "total_tokens", "completion_tokens": 0}}``, in the pairs' order.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from velvetrope.engine.serve.embeddings import EmbeddingServer
from velvetrope.openai.errors import model_not_found
from velvetrope.openai.rerank import PairsRequest, count_pair_tokens, parse_rerank, parse_score
from velvetrope.serving.asgi import Receive, Send, respond

__all__ = ["PairsServer", "pair_score"]


def pair_score(query: str, document: str) -> float:
    """A deterministic relevance score in ``[0, 1)`` of ``document`` for ``query``."""
    h = hashlib.blake2b(f"{query}\x00{document}".encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(h.digest(), "little") / 2.0**64


class PairsServer(EmbeddingServer):
    """The handlers of rerank and score (see
    :class:`~velvetrope.engine.serve.progress.EngineEndpoint` for their parts)."""

    async def _run(
        self, req: PairsRequest, arrived: float, receive: Receive
    ) -> tuple[str, int] | None:
        """Prefill every pair; the request's id and its tokens, ``None`` if the client left."""
        if req.model != self.model:
            raise model_not_found(req.model)
        counts = self.fitting(count_pair_tokens(req, self.tokenizer.count), "pair", None)
        rid = f"rerank-{next(self._ids)}"
        if not await self.prefill(rid, counts, req.body, arrived, receive):
            return None
        return rid, sum(counts)

    async def rerank(self, raw: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /v1/rerank`` or ``/rerank``."""
        req = parse_rerank(raw)
        ran = await self._run(req, arrived, receive)
        if ran is None:
            return
        scores = [pair_score(q, d) for q, d in req.pairs]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.top_n]
        results = [
            {"index": i, "relevance_score": scores[i], "document": {"text": req.pairs[i][1]}}
            for i in order
        ]
        rid, total = ran
        usage = {"prompt_tokens": total, "total_tokens": total}
        body: dict[str, Any] = {"id": rid, "model": self.model, "usage": usage, "results": results}
        await respond(send, 200, orjson.dumps(body))

    async def score(self, raw: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /v1/score``."""
        req = parse_score(raw)
        ran = await self._run(req, arrived, receive)
        if ran is None:
            return
        rid, total = ran
        data = [
            {"index": i, "object": "score", "score": pair_score(q, d)}
            for i, (q, d) in enumerate(req.pairs)
        ]
        usage = {"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0}
        body = {"id": rid, "object": "list", "model": self.model, "data": data, "usage": usage}
        await respond(send, 200, orjson.dumps(body))
