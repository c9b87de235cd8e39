"""The gateway's metric families of its engines, read at scrape time.

The engines (:class:`~velvetrope.gateway.upstream.engines.Engines`, attached with
:meth:`~velvetrope.gateway.ops.metrics.GatewayMetrics.attach_engines`) add, per upstream
(:func:`engine_families`): health, breaker state, the gateway's requests in flight to it,
the last scraped engine gauges (the engine's own names kept verbatim in the ``metric``
label, whatever its dialect), the reading's age, the learned capacity, the corrected load
and the prompt tokens not yet prefilled, the failed scrapes by reason, the saturation state
and the dialect
(:meth:`~velvetrope.gateway.upstream.scrape.Scraper.families`); per pool: live engines,
capacity (per engine × live engines), the saturation rule's room, pending dispatches and
holds.

A prefix-routed pool (``routing: prefix_affinity`` or ``prefix_hash``) adds
(:func:`prefix_families`), read from its
core :class:`~velvetrope.core.prefix_routing.PrefixRouter` at scrape time:
``velvetrope_prefix_routing_total{pool, outcome}`` (``kept``: the engine its prefix points
to took the request; ``overridden``: passed over for load; ``miss``: no engine matched),
``velvetrope_prefix_hashed_blocks_total`` and ``velvetrope_prefix_expected_hit_blocks_total``
(prompt blocks hashed, and those the chosen engine was expected to hold: the expected hit
rate is their ratio, ``prefix_affinity`` only), the same ratio as the gauge
``velvetrope_prefix_expected_hit_ratio`` and ``velvetrope_prefix_index_blocks`` (entries in
the index).
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["engine_families", "prefix_families"]

_BREAKER = {"closed": 0.0, "half_open": 1.0, "open": 2.0}


def engine_families(engines: Any, now: float) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """Gauges of the upstreams, the engines' readings and the pools' capacity."""
    up_labels = ["pool", "upstream"]
    breaker = GaugeMetricFamily(
        "velvetrope_upstream_breaker_state",
        "Circuit breaker: 0 closed, 1 half-open (probing), 2 open.",
        labels=up_labels,
    )
    up_flight = GaugeMetricFamily(
        "velvetrope_upstream_in_flight",
        "The gateway's requests in flight to the upstream.",
        labels=up_labels,
    )
    age = GaugeMetricFamily(
        "velvetrope_engine_reading_age_seconds", "Age of the last reading.", labels=up_labels
    )
    learned = GaugeMetricFamily(
        "velvetrope_engine_capacity",
        "Requests the engine runs at once, as learned from readings that show it queueing"
        " (before one did: its slow-start window).",
        labels=up_labels,
    )
    projected = GaugeMetricFamily(
        "velvetrope_engine_corrected_load",
        "Running + waiting at the last reading, corrected by what was sent and came back since.",
        labels=up_labels,
    )
    backlog = GaugeMetricFamily(
        "velvetrope_engine_prefill_backlog_tokens",
        "Prompt tokens sent to the engine whose first token has not come yet (streamed"
        " requests; the replica choice's first key for tiers with a TTFT objective).",
        labels=up_labels,
    )
    for u in engines.upstreams.status():
        lv = [str(u["pool"]), str(u["url"])]
        breaker.add_metric(lv, _BREAKER.get(str(u["breaker"]), 2.0))
        up_flight.add_metric(lv, float(u["in_flight"]))
    for pool, rule in engines.rules.items():
        for url, e in rule.status(now).items():
            lv = [pool, url]
            if e["running"] is not None:
                age.add_metric(lv, e["age_s"])
                projected.add_metric(lv, e["projected"])
            learned.add_metric(lv, e["capacity"])
            if e["prefill_backlog_tokens"] is not None:
                backlog.add_metric(lv, e["prefill_backlog_tokens"])
    live = GaugeMetricFamily(
        "velvetrope_pool_engines", "Live engines (healthy, breaker closed).", labels=["pool"]
    )
    room = GaugeMetricFamily(
        "velvetrope_saturation_room",
        "Dispatches the pool's engines can take by their readings (absent: unlimited).",
        labels=["pool"],
    )
    pending = GaugeMetricFamily(
        "velvetrope_saturation_pending",
        "Jobs dispatched and not yet handed to an engine.",
        labels=["pool"],
    )
    held = CounterMetricFamily(
        "velvetrope_dispatch_held", "Dispatches held by engine saturation.", labels=["pool"]
    )
    for pool in engines.upstreams.pools:
        live.add_metric([pool], float(len(engines.upstreams.live(pool))))
    for pool, rule in engines.rules.items():
        r = rule.room(now)
        if r != float("inf"):
            room.add_metric([pool], r)
        pending.add_metric([pool], float(rule.pending))
        held.add_metric([pool], float(rule.holds))
    scraper = engines.scraper.families(now) if engines.scraper is not None else []
    prefix = prefix_families(engines.prefix)
    return [
        breaker,
        up_flight,
        age,
        learned,
        projected,
        backlog,
        live,
        room,
        pending,
        held,
        *scraper,
        *prefix,
    ]


def prefix_families(routers: Any) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """Counters of the prefix-routed pools' choices (none without such a pool)."""
    if not routers:
        return []
    outcomes = CounterMetricFamily(
        "velvetrope_prefix_routing",
        "Prefix-routed requests by outcome: kept (the engine the prefix points to), "
        "overridden (passed over for load), miss (no engine matched).",
        labels=["pool", "outcome"],
    )
    hashed = CounterMetricFamily(
        "velvetrope_prefix_hashed_blocks",
        "Prompt blocks hashed for prefix routing.",
        labels=["pool"],
    )
    hits = CounterMetricFamily(
        "velvetrope_prefix_expected_hit_blocks",
        "Prompt blocks the chosen engine was expected to hold (prefix_affinity's index).",
        labels=["pool"],
    )
    ratio = GaugeMetricFamily(
        "velvetrope_prefix_expected_hit_ratio",
        "Expected prefix-cache hit rate: expected hit blocks over hashed blocks.",
        labels=["pool"],
    )
    size = GaugeMetricFamily(
        "velvetrope_prefix_index_blocks", "Block entries in the prefix index.", labels=["pool"]
    )
    for pool, r in routers.items():
        outcomes.add_metric([pool, "kept"], float(r.kept))
        outcomes.add_metric([pool, "overridden"], float(r.overridden))
        outcomes.add_metric([pool, "miss"], float(r.missed))
        hashed.add_metric([pool], float(r.hashed_blocks))
        hits.add_metric([pool], float(r.matched_blocks))
        if r.expected_hit_rate is not None:
            ratio.add_metric([pool], r.expected_hit_rate)
        size.add_metric([pool], float(len(r.index)))
    return [outcomes, hashed, hits, ratio, size]
