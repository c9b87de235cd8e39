"""``GET /v1/models`` and ``GET /v1/models/{id}`` of the gateway: the models of every pool.

One live upstream of each pool is asked at once; their lists are merged in the order of
``policy.pools``, each id once (the first pool's object).  With some pools unanswered the
list has what the others said; with none, 503 (no live upstream) or 502.  A model found: 200
with its object; not found while every pool answered: 404 ``model_not_found`` in OpenAI's
shape; else the failure's status.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from velvetrope.gateway.upstream.upstreams import UpstreamPools
from velvetrope.openai.errors import error_body, error_payload, retry_headers
from velvetrope.serving.asgi import Send, respond

__all__ = ["answer_models", "pool_models"]


async def answer_models(
    send: Send,
    session: aiohttp.ClientSession | None,
    upstreams: UpstreamPools,
    pools: list[str],
    timeout: aiohttp.ClientTimeout,
    model_id: str | None,
) -> None:
    """Answer ``GET /v1/models`` (``model_id`` None) or ``GET /v1/models/{model_id}`` from
    the upstreams of ``pools`` (see the module docstring)."""
    answers = await asyncio.gather(*(pool_models(session, upstreams, p, timeout) for p in pools))
    models: dict[str, dict[str, object]] = {}
    failure: tuple[int, str, str] | None = None
    for answer in answers:
        if isinstance(answer, tuple):
            failure = failure or answer
            continue
        for m in answer:
            models.setdefault(str(m["id"]), m)
    if model_id is None:
        if failure is not None and not models:
            await _error(send, *failure)
            return
        listing = {"object": "list", "data": list(models.values())}
        await respond(send, 200, orjson.dumps(listing))
    elif model_id in models:
        await respond(send, 200, orjson.dumps(models[model_id]))
    elif failure is not None:
        await _error(send, *failure)
    else:
        msg = f"The model '{model_id}' does not exist or you do not have access to it."
        body = error_payload(404, msg, "model_not_found", None, "invalid_request_error")
        await respond(send, 404, orjson.dumps(body), retry_headers(404))


async def _error(send: Send, status: int, message: str, code: str) -> None:
    await respond(send, status, error_body(status, message, code), retry_headers(status, code))


async def pool_models(
    session: aiohttp.ClientSession | None,
    upstreams: UpstreamPools,
    pool: str,
    timeout: aiohttp.ClientTimeout,
) -> list[dict[str, object]] | tuple[int, str, str]:
    """The model objects one live upstream of ``pool`` lists (those with a string
    ``id``), or the error to answer when none could say: ``(status, message, code)``."""
    live = upstreams.live(pool)
    if not live or session is None:
        return 503, f"no healthy upstream in pool {pool!r}", "no_healthy_upstream"
    up = min(live, key=lambda u: u.in_flight)
    try:
        a = up.access
        async with session.get(
            up.url + "/v1/models", timeout=timeout, headers=a.headers, ssl=a.aiohttp_ssl
        ) as r:
            raw = await r.read()
            if r.status != 200:
                detail = raw[:200].decode("utf-8", "replace")
                return 502, f"upstream {up.url} answered {r.status}: {detail}", "upstream_error"
        data = orjson.loads(raw)["data"]
        if not isinstance(data, list):
            raise TypeError("data is not a list")
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        return 502, f"upstream {up.url} failed: {e}", "upstream_error"
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        return 502, f"upstream {up.url} listed no models: {e}", "upstream_error"
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
