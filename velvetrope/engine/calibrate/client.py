"""Calibration's HTTP side: run the sweep against a live endpoint and fit the result.

:func:`calibrate` streams the plan's requests with aiohttp, times every chunk on the
client side, and hands the traces to the pure modules (:mod:`.observe`, :mod:`.fit`).  The
only module of :mod:`velvetrope.engine.calibrate` that does I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from velvetrope.engine.calibrate.fit import build_profile, fit_observations
from velvetrope.engine.calibrate.observe import (
    Observation,
    ProbeRun,
    RequestTrace,
    aggregate_observations,
    observations_from_run,
)
from velvetrope.engine.calibrate.plan import Probe, make_plan, plan_requests
from velvetrope.engine.calibrate.report import CalibrationResult
from velvetrope.engine.profile import EngineProfile, load_profile
from velvetrope.errors import (
    PolicyError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
    VelvetropeError,
)
from velvetrope.openai.sse import DONE_DATA, content_choices, data_of
from velvetrope.openai.tokenizer import Tokenizer, get_tokenizer

__all__ = ["DEFAULT_BASE_PROFILE", "CalibrationSettings", "calibrate"]

DEFAULT_BASE_PROFILE = "llama3-8b-h100"
"""``velvetrope engine``'s default profile: where KV and scheduler limits come from."""

_WARMUP_PROMPT = 512  # tokens; also measures the endpoint's tokenizer against cl100k_base
_BURSTY = 0.25  # fraction of short chunk gaps above which a note warns of bursty deliveries
_FILLER = " hello"  # one cl100k_base token per repetition


@dataclass(frozen=True)
class CalibrationSettings:
    """Everything :func:`calibrate` needs.

    ``url`` is the endpoint's base URL (``http://host:port`` or ``.../v1``); ``model``
    defaults to the first one ``GET /v1/models`` lists; ``speed_hint`` is K (model seconds
    per wall second: 1 for a real engine); ``base_profile`` (name or YAML file) supplies
    the KV-cache and scheduler limits and the plan's sizes; ``max_seconds`` bounds the
    sweep's wall time (no probe starts after it); ``request_timeout_s`` bounds the silence
    between two reads of a stream.  ``max_model_len`` (the context one request may use) and
    ``slots`` (how many requests the engine runs at once) override what the endpoint says
    of itself (see :func:`calibrate`).
    """

    url: str
    model: str | None = None
    api_key: str | None = None
    base_profile: str = DEFAULT_BASE_PROFILE
    speed_hint: float = 1.0
    quick: bool = False
    repeats: int | None = None
    max_seconds: float = 600.0
    request_timeout_s: float = 120.0
    name: str | None = None
    jitter_wall_s: float = 5e-4
    max_model_len: int | None = None
    slots: int | None = None

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.url):
            raise PolicyError(f"--url must be an http(s):// URL, got {self.url!r}")
        for attr in ("speed_hint", "max_seconds", "request_timeout_s"):
            v = getattr(self, attr)
            if not (v > 0 and math.isfinite(v)):
                raise PolicyError(f"{attr} must be a positive number, got {v!r}")
        for attr in ("max_model_len", "slots"):
            v = getattr(self, attr)
            if v is not None and v < 1:
                raise PolicyError(f"{attr} must be >= 1, got {v!r}")

    @property
    def base_url(self) -> str:
        """The URL without a trailing ``/`` or ``/v1``."""
        u = self.url.rstrip("/")
        return u[:-3] if u.endswith("/v1") else u


class _Client:
    """Streams completions from one endpoint and times their chunks."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]
    ) -> None:
        self._s = session
        self._url = base_url
        self._headers = headers
        self.requests = 0

    @contextlib.contextmanager
    def _errors(self, url: str, timeout: str) -> Iterator[None]:
        """aiohttp's failures as our own: a timeout (``timeout`` says which), an endpoint
        that cannot be reached, any other client error."""
        try:
            yield
        except TimeoutError:
            raise UpstreamTimeout(f"{url} {timeout}") from None
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamUnreachable(
                f"cannot reach {self._url} (is the endpoint running, is the URL right?): {exc}"
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{url}: {exc}") from None

    async def get_json(self, path: str) -> Any:
        url = self._url + path
        with self._errors(url, "did not answer in time"):
            async with self._s.get(url, headers=self._headers) as r:
                body = await r.read()
                if r.status != 200:
                    raise UpstreamError(_http_error(url, r.status, body))
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise UpstreamError(f"{url} did not answer JSON") from None

    async def stream(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        on_chunk: Callable[[int], None] | None = None,
    ) -> RequestTrace:
        url = self._url + "/v1/completions"
        body = orjson.dumps(
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,
            }
        )
        chunks: list[float] = []
        usage: dict[str, Any] | None = None
        self.requests += 1
        clock = time.perf_counter
        with self._errors(url, "stopped streaming for more than the request timeout"):
            sent = clock()
            async with self._s.post(
                url, data=body, headers={**self._headers, "content-type": "application/json"}
            ) as r:
                if r.status != 200:
                    raise UpstreamError(_http_error(url, r.status, await r.read()))
                async for line in r.content:
                    now = clock()
                    payload = data_of(line)
                    if payload is None:
                        continue
                    if payload == DONE_DATA:
                        break
                    try:
                        ev = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        raise UpstreamError(f"{url}: a stream event is not JSON") from None
                    if not isinstance(ev, dict):
                        continue
                    if "error" in ev:
                        raise UpstreamError(f"{url}: the stream ended with an error: {ev['error']}")
                    # a token is a chunk with text: not one with only a finish reason (llama.cpp
                    # ends its streams with one whose text is empty), a role or a usage
                    if content_choices(ev):
                        chunks.append(now)
                        if on_chunk is not None:
                            on_chunk(len(chunks))
                    u = ev.get("usage")
                    if isinstance(u, dict):
                        usage = u
        if usage is None:
            raise UpstreamError(
                f"{url} sent no usage chunk: the endpoint must support stream_options.include_usage"
            )
        try:
            prompt_tokens = int(usage["prompt_tokens"])
            completion_tokens = int(usage["completion_tokens"])
        except (KeyError, TypeError, ValueError):
            raise UpstreamError(f"{url} sent a usage chunk without token counts") from None
        return RequestTrace(sent, tuple(chunks), prompt_tokens, completion_tokens)


def _http_error(url: str, status: int, body: bytes) -> str:
    msg = body[:300].decode("utf-8", "replace")
    try:
        doc = orjson.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            msg = str(doc["error"].get("message", msg))
        elif isinstance(doc, dict) and "message" in doc:
            msg = str(doc["message"])
    except orjson.JSONDecodeError:
        pass
    hint = ""
    if status in (401, 403):
        hint = " (pass --api-key)"
    elif status == 400:
        hint = " (a prompt too long for the engine's context? pass --max-model-len)"
    return f"{url} answered HTTP {status}{hint}: {msg}"


class _Prompts:
    """Prompts of a target length: a unique tag (defeats prefix caching) + filler.

    Lengths are counted with ``cl100k_base``; :meth:`adapt` rescales the filler once the
    endpoint has reported how many tokens its own tokenizer made of a known prompt.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._run = uuid.uuid4().hex[:8]
        self._i = 0
        self._ratio = 1.0  # endpoint tokens per cl100k token of filler

    def make(self, tokens: int) -> str:
        self._i += 1
        tag = f"calibration {self._run}.{self._i}:"
        n = round((tokens - self._tok.count(tag)) / self._ratio)
        return tag + _FILLER * max(1, n)

    def adapt(self, target: int, reported: int) -> None:
        """The endpoint counted ``reported`` tokens for a prompt made for ``target``."""
        if target > 0 and reported > 0:
            self._ratio = min(4.0, max(0.25, reported / target))


def _unwrap(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of an exception group, preferring our own errors."""
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[BaseException]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(group)
    for e in leaves:
        if isinstance(e, VelvetropeError):
            return e
    return leaves[0]


async def _run_probe(client: _Client, model: str, prompts: _Prompts, probe: Probe) -> ProbeRun:
    """Run one probe against the endpoint (one request, a host and a guest, or a batch)."""
    try:
        if probe.kind == "single":
            tr = await client.stream(model, prompts.make(probe.prompt_tokens), probe.output_tokens)
            return ProbeRun(probe, (tr,))
        if probe.kind == "mixed":
            ready = asyncio.Event()
            host_prompt = prompts.make(probe.prompt_tokens)
            guest_prompt = prompts.make(probe.guest_prompt_tokens)

            async def guest() -> RequestTrace:
                await ready.wait()
                return await client.stream(model, guest_prompt, 1)

            def on_chunk(count: int) -> None:
                if count == probe.guest_after:
                    ready.set()

            async with asyncio.TaskGroup() as tg:
                h = tg.create_task(
                    client.stream(model, host_prompt, probe.output_tokens, on_chunk=on_chunk)
                )
                g = tg.create_task(guest())
            return ProbeRun(probe, (h.result(), g.result()))
        texts = [prompts.make(probe.prompt_tokens) for _ in range(probe.streams)]
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(client.stream(model, t, probe.output_tokens)) for t in texts]
        return ProbeRun(probe, tuple(t.result() for t in tasks))
    except BaseExceptionGroup as eg:
        raise _unwrap(eg) from None


async def calibrate(
    settings: CalibrationSettings, progress: Callable[[str], None] | None = None
) -> CalibrationResult:
    """Run the sweep against ``settings.url``, fit, and build the calibrated profile.

    ``progress`` receives one line per probe.  See the module docstring for the bounds
    and the errors raised.
    """
    say = progress or (lambda _msg: None)
    try:
        base = load_profile(settings.base_profile)
    except VelvetropeError as exc:
        raise PolicyError(f"--base-profile: {exc}") from None
    headers = {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=10.0, sock_read=settings.request_timeout_s
    )
    t0 = time.monotonic()
    runs: list[ProbeRun] = []
    notes: list[str] = []
    # A new connection per request: some servers (llama.cpp's) close a connection after a
    # streamed response while advertising keep-alive, and a request sent on it as the close
    # arrives fails.  On loopback a connection costs tens of microseconds, which the fitted
    # per-request overhead absorbs.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        client = _Client(session, settings.base_url, headers)
        try:
            models = await client.get_json("/v1/models")
        except UpstreamUnreachable:
            raise
        except UpstreamError:
            if settings.model is None:
                raise
            models = None  # no model list: trust --model, no max_model_len
        model, listed_mml = _pick_model(models, settings.model, settings.base_url)
        props = await _props(client)
        mml = settings.max_model_len or listed_mml or props[0]
        slots = settings.slots or props[1]
        base = _endpoint_limits(base, mml, slots, notes)
        plan = make_plan(base, quick=settings.quick, repeats=settings.repeats, max_model_len=mml)
        prompts = _Prompts(get_tokenizer("cl100k_base"))
        say(
            f"calibrating {settings.base_url} model={model}: {len(plan)} probes, "
            f"{plan_requests(plan)} requests, speed hint {settings.speed_hint:g}"
            + (f", context {mml} tokens" if mml else "")
            + (f", {slots} slots" if slots else "")
        )
        # the warm-up also measures the endpoint's tokenizer: it fits the context even if
        # the endpoint makes up to 4 tokens (the most :meth:`_Prompts.adapt` assumes) of one
        warm_target = _WARMUP_PROMPT if mml is None else max(16, min(_WARMUP_PROMPT, mml // 5))
        warm = await client.stream(model, prompts.make(warm_target), 4)  # not measured
        prompts.adapt(warm_target, warm.prompt_tokens)
        for i, probe in enumerate(plan, 1):
            elapsed = time.monotonic() - t0
            if elapsed > settings.max_seconds:
                notes.append(
                    f"stopped after {i - 1} of {len(plan)} probes: --max-seconds "
                    f"{settings.max_seconds:g} reached"
                )
                say(notes[-1])
                break
            ts = time.monotonic()
            runs.append(await _run_probe(client, model, prompts, probe))
            say(f"  [{i}/{len(plan)}] {probe.label}: {time.monotonic() - ts:.2f} s")
        requests = client.requests
    wall = time.monotonic() - t0
    observations: list[Observation] = []
    dropped: list[str] = []
    for run in runs:
        obs, why = observations_from_run(run, base, settings.speed_hint)
        observations.extend(obs)
        notes.extend(why)
        dropped.extend(why)
    rows = aggregate_observations(observations)
    bursty = [o for o in rows if o.bursty > _BURSTY]
    if bursty:
        worst = max(bursty, key=lambda o: o.bursty)
        notes.append(
            f"deliveries came in bursts in {len(bursty)} probe(s) (up to {worst.bursty:.0%} "
            f"of chunk gaps under a third of the median, {worst.label}): the client, the "
            f"server or the engine was not keeping up; spans use the least-delayed chunks, "
            f"but a lower speed (or a less loaded machine) measures better"
        )
    try:
        fit = fit_observations(rows, jitter_s=settings.jitter_wall_s * settings.speed_hint)
    except PolicyError as exc:
        detail = f" Dropped: {'; '.join(dict.fromkeys(dropped))}." if dropped else ""
        raise UpstreamError(f"cannot fit a profile: {exc}{detail}") from None
    finished = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = settings.name or "calibrated-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", model) or "model")
    profile = build_profile(
        fit, base, name, f"calibrated from {model} at {settings.base_url} on {finished[:10]}"
    )
    return CalibrationResult(
        profile=profile,
        fit=fit,
        base=base,
        url=settings.base_url,
        model=model,
        speed_hint=settings.speed_hint,
        plan=plan,
        runs=tuple(runs),
        observations=tuple(observations),
        notes=tuple(dict.fromkeys(notes)),
        requests=requests,
        wall_seconds=wall,
        endpoint_max_model_len=mml,
        finished_at=finished,
    )


async def _props(client: _Client) -> tuple[int | None, int | None]:
    """``(context per request, slots)`` from llama.cpp's ``GET /props``
    (``default_generation_settings.n_ctx``, ``total_slots``); ``(None, None)`` from an
    endpoint without it (vLLM answers 404)."""
    try:
        doc = await client.get_json("/props")
    except UpstreamUnreachable:
        raise
    except UpstreamError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    settings = doc.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    slots = doc.get("total_slots")
    return (
        n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None,
        slots if isinstance(slots, int) and slots > 0 else None,
    )


def _endpoint_limits(
    base: EngineProfile, mml: int | None, slots: int | None, notes: list[str]
) -> EngineProfile:
    """``base`` with the endpoint's context and concurrency where they are smaller: the
    sweep's prompts must fit one request's context, and a batch probe must not send more
    streams than the engine runs at once (the rest would queue, and no window would have
    them all decoding).  The calibrated profile keeps these limits; ``notes`` says so."""
    kw: dict[str, int] = {}
    if slots is not None and slots < base.max_num_seqs:
        kw["max_num_seqs"] = slots
    if mml is not None and mml < base.max_model_len:
        kw["max_model_len"] = mml
    if not kw:
        return base
    notes.append(
        "the endpoint's own limits replace the base profile's: "
        + ", ".join(f"{k} {v} (was {getattr(base, k)})" for k, v in kw.items())
    )
    return base.with_overrides(**kw)


def _pick_model(models: Any, wanted: str | None, url: str) -> tuple[str, int | None]:
    """The model to use and the context one request may use, from ``/v1/models``: vLLM's
    ``max_model_len`` or llama.cpp's ``meta.n_ctx`` (a slot's context)."""
    data = models.get("data") if isinstance(models, dict) else None
    entries = (
        [m for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []
    )
    if wanted is None:
        if not entries:
            raise UpstreamError(f"{url}/v1/models lists no model: pass --model")
        entry = entries[0]
    else:
        entry = next((m for m in entries if m["id"] == wanted), {"id": wanted})
    mml = entry.get("max_model_len")
    meta = entry.get("meta")
    if mml is None and isinstance(meta, dict):
        mml = meta.get("n_ctx")
    return str(entry["id"]), mml if isinstance(mml, int) and mml > 0 else None
