"""The view model of ``velvetrope top``: one frame's figures from the gateways' answers.

Sans-IO: :func:`build_view` takes one :class:`Sample` per gateway (its ``/admin/status``
JSON and its parsed ``/metrics``, or why they could not be read), the previous sample of
each (by URL) and the viewer's :class:`~velvetrope.top.controls.Controls`, and returns a
:class:`View`: rows that the renderer only formats.

Figures and where they come from:

* **Gauges** (queue depth by pool, band and tenant; in flight and its limit by pool;
  bucket levels; engine readings; breakers; shared state) are ``/admin/status``'s, as
  reported at the sample.  A field a gateway does not report counts as zero (a count) or
  unknown (shown ``-``), never as an error.
* **Rates** are counter increases over the seconds between a gateway's previous sample and
  this one (the poll times, :attr:`Sample.at`): ``velvetrope_requests_total`` by outcome
  and reason (by tenant too when the gateway labels its metrics by tenant), and by endpoint
  kind (chat, embeddings, ...: :attr:`View.endpoints`),
  ``velvetrope_routed_total`` as arrivals.  A counter lower than before restarted from zero
  (a restarted gateway): its increase is its value.  Without a previous sample with
  metrics there is no rate (``None``).  *Admitted* per second is arrivals minus rejections.
* **Waits**: per band, the mean queue wait of the requests that ended in the interval
  (``velvetrope_queue_wait_seconds`` by tier: increase of its sum over increase of its
  count); per pool, the predicted wait: queued tokens over the measured drain rate.
* **Buckets**: level from the status, fill (level over capacity) from
  ``velvetrope_bucket_fill_ratio``.
* **Budgets** (budget burn): each budget of the current window from the status's
  ``budgets``, used of its limit, and when its window resets; over several gateways, the
  most used any reports (with Redis they share one).  Budgets are not among the buckets.

**Order and filter** (:class:`~velvetrope.top.controls.Controls`): tenants by the sort
column, ties by name; outcomes by rate, then total; pools and bands as first reported;
engines by pool and URL.  The filter is applied as :mod:`velvetrope.top.controls` says.

**Several gateway replicas**: counts, in-flight work, tokens and rates are summed over the
gateways that answered.  A pool's in-flight limit is summed when each gateway has its own
(``memory://`` state), and is the largest one reported when all share state in Redis (the
replicas then enforce one limit, and the slots held against it are counted from the leases:
:attr:`PoolRow.held`).  A bucket shows the lowest level any gateway reports.  An
engine shows the freshest reading any gateway holds, its worst breaker state (open, then
half-open, then closed), healthy only if every gateway finds it so, and the gateways'
requests in flight to it summed.  Each gateway has its own :class:`ReplicaRow`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from velvetrope.top.controls import Controls
from velvetrope.top.exposition import Labels
from velvetrope.top.rows import (
    BandRow,
    BucketRow,
    BudgetRow,
    EngineRow,
    OutcomeRow,
    PoolRow,
    ReplicaRow,
    Sample,
    TenantRow,
    band_rows,
    engine_rows,
    pool_rows,
    replica_row,
)

__all__ = ["Sample", "View", "build_view", "counter_rates"]

_REQUESTS = "velvetrope_requests_total"
_ROUTED = "velvetrope_routed_total"
_FILL = "velvetrope_bucket_fill_ratio"


@dataclass(frozen=True, slots=True)
class View:
    """One frame's figures (see the module docstring); rows sorted and filtered."""

    replicas: list[ReplicaRow]
    pools: list[PoolRow]
    bands: list[BandRow]
    tenants: list[TenantRow]
    outcomes: list[OutcomeRow]
    endpoints: list[OutcomeRow]
    """Requests ended by endpoint kind (``outcome`` the kind, ``reason`` empty), busiest
    first: ``velvetrope_requests_total`` by its ``endpoint`` label."""
    buckets: list[BucketRow]
    """The buckets not of a tenant (tiers', models'); tenants' are in :attr:`tenants`."""
    engines: list[EngineRow]
    queued: int
    in_flight: int
    arrived_per_s: float | None
    admitted_per_s: float | None
    rejected_per_s: float | None
    tenant_rates: bool
    """Whether the gateways label requests by tenant (else the tenants have no rates)."""
    controls: Controls = field(default_factory=Controls)
    budgets: list[BudgetRow] = field(default_factory=list)
    """The budgets of the current windows, by whose, window and unit."""

    @property
    def up(self) -> int:
        """Gateways that answered: their status was read, or they refused it with 401 (alive;
        the admin token is missing or wrong)."""
        return sum(1 for r in self.replicas if r.up or r.denied)


def counter_rates(
    samples: Iterable[tuple[Sample, Sample | None]], name: str, key: Callable[[Labels], Any]
) -> dict[Any, float]:
    """Per ``key(labels)``: the per-second increase of counter ``name``, summed over the
    ``(sample, previous)`` pairs that have metrics both times and time between them.  A
    series absent before started at zero; one lower than before restarted from zero."""
    out: dict[Any, float] = {}
    for cur, prev in samples:
        if prev is None or cur.metrics is None or prev.metrics is None or cur.at <= prev.at:
            continue
        dt = cur.at - prev.at
        before = prev.metrics.samples.get(name, {})
        for labels, v in cur.metrics.samples.get(name, {}).items():
            b = before.get(labels, 0.0)
            k = key(labels)
            out[k] = out.get(k, 0.0) + ((v - b) if v >= b else v) / dt
    return out


def _label(labels: Labels, name: str) -> str:
    for k, v in labels:
        if k == name:
            return v
    return ""


def _keep(text: str, names: Iterable[str]) -> Callable[[str], bool]:
    """A test of names for the filter ``text``: names containing it (case-insensitive)
    when any of ``names`` does; everything when none does (the filter names other rows)."""
    t = text.lower()
    if not t or not any(t in n.lower() for n in names):
        return lambda _: True
    return lambda n: t in n.lower()


def _bucket_levels(
    answered: Sequence[Sample],
) -> tuple[dict[str, float], dict[str, float]]:
    """Lowest level and lowest fill of each bucket over ``answered``."""
    levels: dict[str, float] = {}
    fills: dict[str, float] = {}
    for s in answered:
        for k, v in ((s.status or {}).get("buckets") or {}).items():
            if isinstance(v, int | float):
                levels[k] = min(levels.get(k, float(v)), float(v))
        if s.metrics is not None:
            for labels, v in s.metrics.samples.get(_FILL, {}).items():
                k = _label(labels, "bucket")
                fills[k] = min(fills.get(k, v), v)
    return levels, fills


def _budgets(answered: Sequence[Sample], keep: Callable[[str], bool]) -> list[BudgetRow]:
    """Each budget any of ``answered`` reports, the most used (see the module docstring)."""
    most: dict[str, BudgetRow] = {}
    for s in answered:
        for b in (s.status or {}).get("budgets") or []:
            try:
                reset = b.get("reset_s")
                row = BudgetRow(
                    str(b["scope"]), str(b["window"]), str(b["unit"]), float(b["used"]),
                    float(b["limit"]), None if reset is None else float(reset),
                )  # fmt: skip
            except (KeyError, TypeError, ValueError, AttributeError):
                continue  # a field missing or malformed: not shown, never an error
            key = str(b["key"])
            if keep(row.scope) and (key not in most or row.used > most[key].used):
                most[key] = row
    return [most[k] for k in sorted(most)]


def _split_bucket(key: str) -> tuple[str, str, str]:
    """``owner:name:kind`` as its three parts (a name may hold colons)."""
    owner, _, rest = key.partition(":")
    name, _, kind = rest.rpartition(":")
    return owner, name, kind


_SORT_KEYS: dict[str, Callable[[TenantRow], tuple[Any, ...]]] = {
    "queued": lambda t: (-t.queued, t.name),
    "bucket": lambda t: (t.tokens_fill is None, t.tokens_fill or 0.0, t.name),
    "rejected": lambda t: (t.rejected_per_s is None, -(t.rejected_per_s or 0.0), t.name),
    "tenant": lambda t: (t.name,),
}


def _tenants(
    answered: Sequence[Sample],
    pairs: list[tuple[Sample, Sample | None]],
    levels: Mapping[str, float],
    fills: Mapping[str, float],
    controls: Controls,
    has_prev: bool,
) -> tuple[list[TenantRow], bool]:
    queued: dict[str, int] = {}
    for s in answered:
        for t, n in ((s.status or {}).get("tenants_queued") or {}).items():
            queued[t] = queued.get(t, 0) + int(n)
    labelled = any(
        _label(labels, "tenant")
        for s in answered
        if s.metrics is not None
        for labels in s.metrics.samples.get(_REQUESTS, {})
    )
    rates = counter_rates(
        pairs, _REQUESTS, lambda ls: (_label(ls, "tenant"), _label(ls, "outcome"))
    )
    has_rates = labelled and has_prev
    names = set(queued) | {t for t, _ in rates if t}
    names |= {_split_bucket(k)[1] for k in levels if _split_bucket(k)[0] == "tenant"}

    def bucket(name: str, kind: str) -> tuple[float | None, float | None]:
        key = f"tenant:{name}:{kind}"
        return levels.get(key), fills.get(key)

    rows = []
    keep = _keep(controls.filter, names)
    for name in sorted(n for n in names if keep(n)):
        tok, tok_fill = bucket(name, "tok")
        req, req_fill = bucket(name, "req")
        done = rej = None
        if has_rates:
            done = sum(v for (t, o), v in rates.items() if t == name and o == "completed")
            rej = sum(v for (t, o), v in rates.items() if t == name and o == "rejected")
        rows.append(TenantRow(name, queued.get(name, 0), tok, tok_fill, req, req_fill, done, rej))
    rows.sort(key=_SORT_KEYS.get(controls.sort, _SORT_KEYS["queued"]), reverse=controls.reverse)
    return rows, labelled


def _endpoints(
    answered: Sequence[Sample], pairs: list[tuple[Sample, Sample | None]], has_prev: bool
) -> list[OutcomeRow]:
    """Requests by endpoint kind: rate over the interval and total (a gateway without the
    label counts nothing here)."""
    rates = counter_rates(pairs, _REQUESTS, lambda ls: _label(ls, "endpoint"))
    totals: dict[str, float] = {}
    for s in answered:
        for labels, v in (s.metrics.samples if s.metrics else {}).get(_REQUESTS, {}).items():
            k = _label(labels, "endpoint")
            if k:
                totals[k] = totals.get(k, 0.0) + v
    rows = [
        OutcomeRow(k, "", rates.get(k, 0.0) if has_prev else None, int(n))
        for k, n in totals.items()
    ]
    rows.sort(key=lambda o: (-(o.per_s or 0.0), -o.total, o.outcome))
    return rows


def build_view(
    samples: Sequence[Sample],
    previous: Mapping[str, Sample],
    controls: Controls | None = None,
) -> View:
    """The frame of ``samples`` (one per gateway, in the order to show them), with rates
    since ``previous`` (the last sample of each URL; missing: no rate for that gateway)."""
    controls = controls or Controls()
    answered = [s for s in samples if s.status is not None]
    pairs = [(s, previous.get(s.url)) for s in answered]
    shared = bool(answered) and all(
        (s.status or {}).get("state", {}).get("backend") == "redis" for s in answered
    )
    pool_names = {p for s in answered for p in ((s.status or {}).get("pools") or {})}
    keep_pool = _keep(controls.filter, pool_names)
    pools = pool_rows(answered, keep_pool, shared)

    waits = counter_rates(pairs, "velvetrope_queue_wait_seconds_sum", lambda ls: _label(ls, "tier"))
    ended = counter_rates(
        pairs, "velvetrope_queue_wait_seconds_count", lambda ls: _label(ls, "tier")
    )
    mean_wait = {t: waits.get(t, 0.0) / n for t, n in ended.items() if n > 0}
    bands = band_rows(answered, keep_pool, mean_wait)

    has_prev = any(prev is not None and prev.metrics is not None for _, prev in pairs)
    levels, fills = _bucket_levels(answered)
    tenants, labelled = _tenants(answered, pairs, levels, fills, controls, has_prev)
    keep_bucket = _keep(controls.filter, levels)
    buckets = [
        BucketRow(k, levels[k], fills.get(k))
        for k in sorted(levels)
        if _split_bucket(k)[0] not in ("tenant", "quota") and keep_bucket(k)
    ]
    scopes = [str(b.get("scope")) for s in answered for b in (s.status or {}).get("budgets") or []
              if isinstance(b, dict)]  # fmt: skip
    budgets = _budgets(answered, _keep(controls.filter, scopes))

    by_reason = counter_rates(
        pairs, _REQUESTS, lambda ls: (_label(ls, "outcome"), _label(ls, "reason"))
    )
    totals: dict[tuple[str, str], float] = {}
    for s in answered:
        for labels, v in (s.metrics.samples if s.metrics else {}).get(_REQUESTS, {}).items():
            k = (_label(labels, "outcome"), _label(labels, "reason"))
            totals[k] = totals.get(k, 0.0) + v
    outcomes = [
        OutcomeRow(o, r, by_reason.get((o, r), 0.0) if has_prev else None, int(n))
        for (o, r), n in totals.items()
    ]
    outcomes.sort(key=lambda o: (-(o.per_s or 0.0), -o.total, o.outcome, o.reason))
    endpoints = _endpoints(answered, pairs, has_prev)
    arrived = rejected = admitted = None
    if has_prev:
        arrived = sum(counter_rates(pairs, _ROUTED, lambda _: 0).values())
        rejected = sum(v for (o, _), v in by_reason.items() if o == "rejected")
        admitted = max(0.0, arrived - rejected)

    return View(
        replicas=[replica_row(s) for s in samples],
        pools=pools,
        bands=bands,
        tenants=tenants,
        outcomes=outcomes,
        endpoints=endpoints,
        buckets=buckets,
        engines=engine_rows(answered, keep_pool),
        queued=sum(int((s.status or {}).get("queued") or 0) for s in answered),
        in_flight=sum(int((s.status or {}).get("in_flight") or 0) for s in answered),
        arrived_per_s=arrived,
        admitted_per_s=admitted,
        rejected_per_s=rejected,
        tenant_rates=labelled,
        controls=controls,
        budgets=budgets,
    )
