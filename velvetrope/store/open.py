"""Open the :class:`~velvetrope.store.base.Store` that ``state.url`` names."""

from __future__ import annotations

import os
from collections.abc import Callable

from velvetrope.clock import Clock
from velvetrope.config import GatewayConfig
from velvetrope.store.base import Store

__all__ = ["open_store"]


def open_store(
    config: GatewayConfig,
    clock: Clock,
    *,
    observe_call: Callable[[str, float], None] | None = None,
    queue_depth: Callable[[], int] | None = None,
) -> Store:
    """``memory://``: a :class:`~velvetrope.store.memory.MemoryStore`; a Redis URL: a
    :class:`~velvetrope.store.guard.GuardedStore` on it, with ``config.state``'s budgets,
    breaker and failure policy (the Redis client is imported only then).  ``observe_call``
    hears each Redis call's latency by operation; ``queue_depth`` is what this replica's
    heartbeat reports."""
    st = config.state
    if not st.shared:
        from velvetrope.store.memory import MemoryStore

        return MemoryStore(clock)
    from velvetrope.store.connect import connect
    from velvetrope.store.guard import GuardedStore
    from velvetrope.store.redis_store import RedisStore

    password = os.environ.get(st.password_env) if st.password_env else None
    timeout_s = st.call_timeout_ms / 1000.0
    client = connect(st.url, password=password, timeout_s=max(timeout_s, 0.25))
    policy = config.policy
    shared_tag = bool(policy.models) or any(t.limits is not None for t in policy.tiers)
    redis = RedisStore(
        client,
        namespace=st.namespace,
        shared_tag=shared_tag,
        lease_ttl_s=st.lease_ttl_s,
        replica_ttl_s=max(3 * st.heartbeat_s, 1.0),
        hold_ttl_s=st.hold_ttl_s,
    )
    return GuardedStore(
        redis,
        clock,
        on_store_error=st.on_store_error,
        call_timeout_s=timeout_s,
        heartbeat_s=st.heartbeat_s,
        breaker_failures=st.breaker_failures,
        breaker_reset_s=st.breaker_reset_s,
        expected_replicas=st.expected_replicas,
        observe_call=observe_call,
        queue_depth=queue_depth,
    )
