"""Where bucket levels and fleet-wide slots live: memory (one process) or Redis (a fleet).

See :mod:`velvetrope.store.base` for the seam, :mod:`velvetrope.store.redis_store` for the
Lua scripts' home and key layout, and :mod:`velvetrope.store.guard` for the failure policy.
"""

from velvetrope.store.base import BucketStore, FleetSlots, FleetView, LeaseAnswer, Slot
from velvetrope.store.breaker import CircuitBreaker
from velvetrope.store.guard import GuardedState, OnStoreError
from velvetrope.store.memory import MemoryStore
from velvetrope.store.outbox import Outbox
from velvetrope.store.redis_store import RedisStore

__all__ = [
    "BucketStore",
    "CircuitBreaker",
    "FleetSlots",
    "FleetView",
    "GuardedState",
    "LeaseAnswer",
    "MemoryStore",
    "OnStoreError",
    "Outbox",
    "RedisStore",
    "Slot",
]
