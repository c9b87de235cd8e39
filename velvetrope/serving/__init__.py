"""Serving HTTP, shared by the gateway and ``velvetrope engine``.

* :mod:`.asgi`: the small raw-ASGI toolkit both apps use (lifespan, a bounded body
  reader, header lookup, one-shot responses);
* :mod:`.launch`: starting either server as a ``python -m velvetrope`` subprocess on
  loopback and stopping it by its PID (the demo, the benchmarks and the tests).

Import from the modules; this package re-exports nothing, so that importing one does not
load the other (the launcher needs ``httpx``, the ASGI toolkit nothing).
"""

__all__: list[str] = []
