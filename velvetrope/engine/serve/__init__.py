"""``velvetrope engine``: the engine model served in real time behind OpenAI's API.

The HTTP side of :mod:`velvetrope.engine`, apart from the sans-IO model it serves:

* :mod:`.realtime`: :class:`~velvetrope.engine.serve.realtime.RealtimeEngine` steps a
  :class:`~velvetrope.engine.batcher.Batcher` on the wall clock (asyncio); each request's
  side of it is :mod:`.engine_request`;
* :mod:`.app`: the ASGI app (OpenAI's endpoints, ``/health``, ``/metrics``), validating
  requests with :mod:`velvetrope.openai`, made from an :mod:`.engine_config`; its
  completions and chat completions are :mod:`.completions`;
* :mod:`.bodies`: the response bodies and stream chunks it writes;
* :mod:`.metrics`: the Prometheus exposition with vLLM's names;
* :mod:`.server`: uvicorn, signals, :func:`~velvetrope.engine.serve.server.run_engine`;
* :mod:`.cli`: the ``velvetrope engine`` command.

Import from the modules: this package re-exports nothing, so that the command line can
register ``velvetrope engine`` without loading uvicorn.
"""

__all__: list[str] = []
