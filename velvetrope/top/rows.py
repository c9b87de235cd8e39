"""A poll's :class:`Sample`, the rows of ``velvetrope top``'s frame, and the rows built from
``/admin/status`` alone.

Sans-IO.  Each builder takes the samples of the gateways that answered (their ``status``
is not ``None``) and merges them as :mod:`velvetrope.top.model` describes.  A field missing
from a status counts as zero (a count) or unknown (``None``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from velvetrope.top.exposition import Metrics

__all__ = [
    "DENIED",
    "BandRow",
    "BucketRow",
    "BudgetRow",
    "EngineRow",
    "OutcomeRow",
    "PoolRow",
    "ReplicaRow",
    "Sample",
    "TenantRow",
    "band_rows",
    "engine_rows",
    "pool_rows",
    "replica_row",
]

DENIED = "HTTP 401: admin token missing or wrong"
"""The error of a gateway that answered /admin/status with 401: alive, but not readable."""

_BREAKERS = ("closed", "half_open", "open")
"""Breaker states from best to worst (an unknown state counts as open)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One poll of one gateway: when the answers arrived (``at``, seconds on a monotonic
    clock), its ``/admin/status`` JSON and its parsed ``/metrics`` (each ``None`` when it
    could not be read) and, if either failed, why (``error``)."""

    url: str
    at: float
    status: Mapping[str, Any] | None
    metrics: Metrics | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """One gateway: whether its status was read (else ``error`` says why, and ``denied``
    whether it answered 401: alive, but the admin token is missing or wrong), and what it
    says of itself and of its shared state (``backend`` ``memory`` or ``redis``; for Redis,
    whether it answers, the breaker in front of it, the live replicas it counts, the replicas'
    queue at its last heartbeat, the settlements waiting in its outbox and the decisions
    taken without it)."""

    url: str
    up: bool
    error: str | None
    draining: bool
    queued: int
    in_flight: int
    backend: str | None
    state_up: bool | None
    breaker: str | None
    replicas: int | None
    fleet_queued: int | None
    outbox: int | None
    fallbacks: int | None
    denied: bool = False


@dataclass(frozen=True, slots=True)
class PoolRow:
    """One pool: queued requests and tokens, in flight against the limit (``None``: none
    reported), the measured drain rate and the wait it predicts for the queued tokens.

    With shared state, ``held`` is the slots the gateway replicas hold together (their leases,
    in Redis or, Redis away, their local ones); a job the gateway dispatched that still
    waits for its slot is in ``in_flight`` and not in ``held``.  ``None`` without shared
    state."""

    name: str
    queued: int
    queued_tokens: int
    in_flight: int
    held: int | None
    max_in_flight: int | None
    tokens_in_flight: int
    max_tokens_in_flight: int | None
    drain_tokens_per_s: float | None
    predicted_wait_s: float | None
    engines: int


@dataclass(frozen=True, slots=True)
class BandRow:
    """One band (a tier) over the pools shown: queued requests and tokens, and the mean
    queue wait of the requests of its tier that ended in the interval (``None``: none)."""

    name: str
    queued: int
    tokens: int
    wait_s: float | None


@dataclass(frozen=True, slots=True)
class TenantRow:
    """One tenant: queued requests, its token and request buckets (level and fill; ``None``
    when it has no such bucket) and, when requests are labelled by tenant, completions and
    rejections per second."""

    name: str
    queued: int
    tokens: float | None
    tokens_fill: float | None
    requests: float | None
    requests_fill: float | None
    done_per_s: float | None
    rejected_per_s: float | None


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """Requests that ended with ``outcome`` for ``reason``: per second over the interval
    (``None``: no previous sample) and in total since the gateways started."""

    outcome: str
    reason: str
    per_s: float | None
    total: int


@dataclass(frozen=True, slots=True)
class BucketRow:
    """A bucket by its key (``owner:name:tok|req``): level and fill (``None``: unknown)."""

    key: str
    level: float
    fill: float | None


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """A budget of the current window (``/admin/status``'s ``budgets``): whose
    (``tenant`` or ``tenant:model``), its window and unit, used of its limit, seconds until
    its window ends (``None``: rolling, or not said)."""

    scope: str
    window: str
    unit: str
    used: float
    limit: float
    reset_s: float | None

    @property
    def share(self) -> float | None:
        """Used over limit (``None`` for a limit that is not positive)."""
        return self.used / self.limit if self.limit > 0 else None


@dataclass(frozen=True, slots=True)
class EngineRow:
    """One upstream engine: health and breaker, the gateways' requests in flight to it,
    and its last scraped reading (running, waiting, KV-cache usage, the reading's age, the
    capacity learned from it; ``None`` when no live gateway holds a reading)."""

    url: str
    pool: str
    healthy: bool
    breaker: str
    gateway_in_flight: int
    running: float | None
    waiting: float | None
    kv_usage: float | None
    age_s: float | None
    capacity: float | None


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(d: Mapping[str, Any], key: str) -> int:
    return int(_num(d, key) or 0)


def _status(s: Sample) -> Mapping[str, Any]:
    return s.status or {}


def replica_row(s: Sample) -> ReplicaRow:
    """The row of one gateway, answered or not."""
    st = _status(s)
    state = st.get("state") or {}
    redis = state.get("backend") == "redis"
    fallbacks = state.get("fallbacks")
    return ReplicaRow(
        url=s.url,
        up=s.status is not None,
        error=s.error,
        draining=bool(st.get("draining")),
        queued=_int(st, "queued"),
        in_flight=_int(st, "in_flight"),
        backend=state.get("backend"),
        state_up=state["up"] if isinstance(state.get("up"), bool) else None,
        breaker=state.get("breaker") if redis else None,
        replicas=_int(state, "replicas") if redis else None,
        fleet_queued=_int(state, "fleet_queue_depth") if redis else None,
        outbox=_int(state, "outbox") if redis else None,
        fallbacks=int(sum(fallbacks.values())) if isinstance(fallbacks, dict) else None,
        denied=s.status is None and s.error == DENIED,
    )


def pool_rows(
    answered: Sequence[Sample], keep: Callable[[str], bool], shared: bool
) -> list[PoolRow]:
    """The pools that ``keep`` keeps, in the order first reported; limits summed, or the
    largest when the gateways share their state (``shared``: then the slots held too)."""
    merged: dict[str, list[Mapping[str, Any]]] = {}
    held: dict[str, int] = {}
    for s in answered:
        st = _status(s)
        for name, p in (st.get("pools") or {}).items():
            if keep(name) and isinstance(p, dict):
                merged.setdefault(name, []).append(p)
        state = st.get("state") or {}
        for leases in (state.get("leases"), state.get("local_leases")):
            for name, n in (leases or {}).items():
                held[name] = held.get(name, 0) + int(n)
    rows = []
    for name, ps in merged.items():

        def total(key: str, ps: list[Mapping[str, Any]] = ps) -> int:
            return sum(_int(p, key) for p in ps)

        def limit(key: str, ps: list[Mapping[str, Any]] = ps) -> int | None:
            vals = [v for p in ps if (v := _num(p, key)) is not None]
            if not vals:
                return None
            return int(max(vals) if shared else sum(vals))

        drains = [v for p in ps if (v := _num(p, "drain_tokens_per_s")) is not None]
        drain = sum(drains) if drains else None
        queued_tokens = total("queued_tokens")
        wait = queued_tokens / drain if drain else None
        rows.append(
            PoolRow(
                name,
                total("queued"),
                queued_tokens,
                total("in_flight"),
                held.get(name, 0) if shared else None,
                limit("max_in_flight"),
                total("tokens_in_flight"),
                limit("max_tokens_in_flight"),
                drain,
                wait,
                max(_int(p, "engines") for p in ps),
            )
        )
    return rows


def band_rows(
    answered: Sequence[Sample], keep_pool: Callable[[str], bool], mean_wait: Mapping[str, float]
) -> list[BandRow]:
    """The bands over the pools that ``keep_pool`` keeps, in the order first reported, with
    the mean wait of their tier from ``mean_wait``."""
    queued: dict[str, int] = {}
    tokens: dict[str, int] = {}
    for s in answered:
        for pool, p in (_status(s).get("pools") or {}).items():
            if not keep_pool(pool) or not isinstance(p, dict):
                continue
            for band, b in (p.get("bands") or {}).items():
                queued[band] = queued.get(band, 0) + _int(b, "queued")
                tokens[band] = tokens.get(band, 0) + _int(b, "tokens")
    return [BandRow(b, n, tokens[b], mean_wait.get(b)) for b, n in queued.items()]


def _worst(states: list[str]) -> str:
    return max(states, key=lambda b: _BREAKERS.index(b) if b in _BREAKERS else len(_BREAKERS))


def engine_rows(answered: Sequence[Sample], keep_pool: Callable[[str], bool]) -> list[EngineRow]:
    """The upstreams of the pools that ``keep_pool`` keeps, by pool then URL, each with
    the freshest reading any gateway holds."""
    ups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    readings: dict[str, Mapping[str, Any]] = {}
    for s in answered:
        st = _status(s)
        for u in st.get("upstreams") or []:
            if isinstance(u, dict) and keep_pool(str(u.get("pool", ""))):
                ups.setdefault((str(u.get("pool", "")), str(u.get("url", ""))), []).append(u)
        for url, r in (st.get("engine_load") or {}).items():
            if not isinstance(r, dict) or _num(r, "age_s") is None:
                continue
            old = readings.get(url)
            if old is None or (_num(r, "age_s") or 0.0) < (_num(old, "age_s") or 0.0):
                readings[url] = r
    rows = []
    for (pool, url), us in sorted(ups.items()):
        r = readings.get(url, {})
        rows.append(
            EngineRow(
                url,
                pool,
                all(u.get("healthy") is True for u in us),
                _worst([str(u.get("breaker", "?")) for u in us]),
                sum(_int(u, "in_flight") for u in us),
                _num(r, "running"),
                _num(r, "waiting"),
                _num(r, "kv_usage"),
                _num(r, "age_s"),
                _num(r, "capacity"),
            )
        )
    return rows
