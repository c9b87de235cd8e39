"""Record the calls one streamed chat completion makes between velvetrope's modules, in the
gateway's own code, in a process of its own (``harness.design_walk`` runs it)::

    python -m harness.walk_record --redis redis://127.0.0.1:P/0 --engine http://127.0.0.1:Q

prints one JSON list of ``[caller module, caller function, callee module, callee function]``,
one entry per *cross-module call* (the callee's module differs from its caller's), in the
order they happened.  Module names drop the ``velvetrope.`` prefix; functions are qualified
names (``Admission.enter``).

How the request is made: a :class:`~velvetrope.gateway.api.app.Gateway` on ``redis://`` state
(``state.url``) and the ``velvetrope engine`` at ``--engine``, started (its ASGI
``startup``) in this process; the official ``openai`` client streams one chat completion
into it through ``httpx2.ASGITransport`` (the ``httpx`` that ``openai`` is built on).  One
request first, unrecorded (connections, script loading: start-up work, not the path), then,
once the engine's ``/metrics`` has been read, the recorded one.

What is recorded, with :func:`sys.setprofile`:

* a function's start (not a coroutine's or generator's resumption: the ``RESUME``
  instruction it starts at says which) while the recorded request's context is current (a
  :class:`contextvars.ContextVar` set in the request's task: tasks and callbacks it spawns
  inherit it; the gateway's background loops, started before, do not);
* its caller: the nearest velvetrope frame below it (a call through a library, e.g.
  ``contextlib``, counts for the velvetrope function that made it); for a coroutine run as
  a task, the velvetrope function that created the task (the loop's task factory notes
  it).  A callback scheduled on the loop has no caller and is counted as no call.

Compiled modules: mypyc's extensions emit no profile events, and ``VELVETROPE_PURE=1`` is a
switch of the install (``setup.py``), not of the run.  So this process imports every
``velvetrope`` module from its ``.py`` source, beside its extension (a finder first on
``sys.meta_path``), and refuses to report if any extension was loaded all the same.  The
compiled modules are built from these very sources (``velvetrope/fresh.py`` refuses a
stale build), so the calls are the same ones; only their cost differs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dis
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from collections.abc import Coroutine, Sequence
from typing import Any

__all__ = ["Call", "SourcesFirst", "main", "record"]

Call = tuple[str, str, str, str]
"""``(caller module, caller function, callee module, callee function)``."""

PACKAGE = "velvetrope"
KEY = "sk-walk-tenant-key"
MODEL = "velvetrope-sim"
_RESUME = dis.opmap["RESUME"]  # oparg 0: a function's start; else a resumption
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


class SourcesFirst(importlib.abc.MetaPathFinder):
    """Finds ``velvetrope``'s submodules as ``.py`` sources only (never an extension)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PACKAGE + ".") or path is None:
            return None
        loaders = (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)
        for entry in path:
            spec = importlib.machinery.FileFinder(entry, loaders).find_spec(fullname, target)
            if spec is not None:
                return spec
        return None


def _extensions_loaded() -> list[str]:
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(
        name
        for name, mod in list(sys.modules.items())
        if name.startswith(PACKAGE) and str(getattr(mod, "__file__", "")).endswith(suffixes)
    )


def _module(frame: types.FrameType) -> str:
    name = frame.f_globals.get("__name__", "")
    return name if isinstance(name, str) else ""


def _ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _short(module: str) -> str:
    return module[len(PACKAGE) + 1 :] if module.startswith(PACKAGE + ".") else module


def _nearest_ours(frame: types.FrameType | None) -> types.FrameType | None:
    while frame is not None and not _ours(_module(frame)):
        frame = frame.f_back
    return frame


def _starts(frame: types.FrameType) -> bool:
    """Is this profile ``call`` event a function's start (not a resumption)?"""
    code = frame.f_code
    if not code.co_flags & _GENERATOR_FLAGS:
        return True
    raw = code.co_code
    at = frame.f_lasti
    return at + 1 < len(raw) and raw[at] == _RESUME and raw[at + 1] == 0


class Recorder:
    """The profile hook and the task factory of one recording (see the module docstring)."""

    def __init__(self) -> None:
        self.walking = contextvars.ContextVar[bool]("walking", default=False)
        self.calls: list[Call] = []
        self._spawned: dict[int, tuple[str, str]] = {}  # id(coroutine frame) → its creator

    def task_factory(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        frame = getattr(coro, "cr_frame", None)
        creator = _nearest_ours(sys._getframe(1))
        if frame is not None and creator is not None and self.walking.get():
            self._spawned[id(frame)] = (_module(creator), creator.f_code.co_qualname)
        return asyncio.Task(coro, loop=loop, **kw)

    def hook(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call" or not self.walking.get():
            return
        callee = _module(frame)
        if not _ours(callee) or not _starts(frame):
            return
        spawner = self._spawned.pop(id(frame), None)
        if spawner is not None:
            caller, function = spawner
        else:
            back = _nearest_ours(frame.f_back)
            if back is None:
                return
            caller, function = _module(back), back.f_code.co_qualname
        if caller != callee:
            self.calls.append((_short(caller), function, _short(callee), frame.f_code.co_qualname))


async def _stream(client: Any) -> str:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Walk me through the gateway"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = []
    async for chunk in stream:
        text += [c.delta.content or "" for c in chunk.choices]
    return "".join(text)


async def _engine_read(gw: Any, timeout_s: float = 20.0) -> None:
    """Wait (bounded) until the gateway has read every engine's ``/metrics`` once: the
    recorded request then finds the engine known, as every request after start-up does."""
    scraper = gw.engines.scraper
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while scraper is not None and not (
        scraper.watches and all(w.sample is not None for w in scraper.watches.values())
    ):
        if loop.time() > deadline:
            raise RuntimeError(f"no reading of the engine's /metrics after {timeout_s}s")
        await asyncio.sleep(0.02)


async def _record(redis_url: str, engine_url: str) -> list[Call]:
    import httpx2  # the HTTP client the openai package is built on
    import openai

    from velvetrope.config import GatewayConfig
    from velvetrope.gateway.api.app import Gateway

    cfg = {
        "admin_token": "walk-admin-token",
        "api_keys": [{"tenant": "walker", "key": KEY}],
        "policy": {
            "preset": "hybrid",
            "tenants": [{"name": "walker", "tier": "default"}],
            "pools": [{"name": "default", "max_in_flight": 8}],
        },
        "upstreams": {"default": [{"url": engine_url}]},
        "state": {"url": redis_url, "namespace": f"walk{os.getpid()}"},
    }
    gw = Gateway(GatewayConfig.model_validate(cfg))
    rec = Recorder()
    asyncio.get_running_loop().set_task_factory(rec.task_factory)  # type: ignore[arg-type]
    await gw.startup()
    transport = httpx2.ASGITransport(app=gw)
    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://gateway") as http:
            client = openai.AsyncOpenAI(
                api_key=KEY, base_url="http://gateway/v1", http_client=http, max_retries=0
            )
            if not await _stream(client):  # start-up work, unrecorded
                raise RuntimeError("the warm-up request streamed no text")
            await _engine_read(gw)

            async def walked() -> str:
                rec.walking.set(True)
                sys.setprofile(rec.hook)
                try:
                    return await _stream(client)
                finally:
                    sys.setprofile(None)

            if not await asyncio.get_running_loop().create_task(walked()):
                raise RuntimeError("the recorded request streamed no text")
    finally:
        await gw.shutdown()
    return rec.calls


def record(redis_url: str, engine_url: str) -> list[Call]:
    """The cross-module calls of one streamed chat completion (see the module docstring).
    Call it in a fresh process: it imports ``velvetrope`` from its sources first."""
    if not any(isinstance(f, SourcesFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, SourcesFirst())
    calls = asyncio.run(_record(redis_url, engine_url))
    compiled = _extensions_loaded()
    if compiled:
        raise RuntimeError(f"compiled modules were loaded, their calls unseen: {compiled}")
    return calls


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis", required=True, help="the state.url of the gateway")
    ap.add_argument("--engine", required=True, help="the velvetrope engine's base URL")
    args = ap.parse_args(argv)
    json.dump(record(args.redis, args.engine), sys.stdout)


if __name__ == "__main__":
    main()
