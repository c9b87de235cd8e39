"""Where bucket levels and fleet-wide slots live: memory (one process) or Redis (a fleet).

:mod:`velvetrope.store.base` is the one interface (:class:`~velvetrope.store.base.Store`),
:func:`velvetrope.store.open.open_store` picks its implementation from ``state.url``:
:mod:`velvetrope.store.memory` or :mod:`velvetrope.store.guard` (the failure policy: calls
in :mod:`~velvetrope.store.call_guard`, reservations and settlements in
:mod:`~velvetrope.store.settlement`, leases in :mod:`~velvetrope.store.leases`) over
:mod:`velvetrope.store.redis_store` (the Lua scripts' home and key layout).  This package
imports nothing itself, so a process on ``memory://`` never loads the Redis client.
"""
