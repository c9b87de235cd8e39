"""``top``'s view model: recorded gateway answers in, the frame's figures out."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from tests.top.samples import sample, status, text
from velvetrope.top import SORTS, Controls, Sample, View, build_view, parse_metrics
from velvetrope.top.rows import DENIED
from velvetrope.top.sections import sections

GW = "http://gw-a:8080"
GW_B = "http://gw-b:8080"


def memory_view(dt: float = 1.0, controls: Controls | None = None) -> View:
    """The recorded memory gateway: poll 1, with poll 0 ``dt`` seconds before."""
    return build_view(
        [sample("memory-1-gw0", GW, dt)], {GW: sample("memory-0-gw0", GW, 0.0)}, controls
    )


def counter(name: str, line_start: str) -> float:
    """A counter read from the recorded text by hand (not by the parser under test)."""
    total = 0.0
    for line in text(name).splitlines():
        if line.startswith(line_start):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_gauges_are_the_status_figures() -> None:
    st = status("memory-1-gw0")
    view = memory_view()
    pool = st["pools"]["default"]
    (row,) = view.pools
    assert (row.name, row.queued, row.in_flight, row.max_in_flight) == (
        "default",
        pool["queued"],
        pool["in_flight"],
        pool["max_in_flight"],
    )
    assert (row.queued_tokens, row.tokens_in_flight) == (
        pool["queued_tokens"],
        pool["tokens_in_flight"],
    )
    assert row.held is None  # memory://: no leases
    assert row.predicted_wait_s == pytest.approx(pool["queued_tokens"] / pool["drain_tokens_per_s"])
    assert {b.name: b.queued for b in view.bands} == {
        b: v["queued"] for b, v in pool["bands"].items()
    }
    assert {t.name: t.queued for t in view.tenants if t.queued} == st["tenants_queued"]
    bronze = next(t for t in view.tenants if t.name == "bronze")
    assert bronze.requests == st["buckets"]["tenant:bronze:req"]
    assert bronze.tokens == st["buckets"]["tenant:bronze:tok"]
    assert (view.queued, view.in_flight) == (st["queued"], st["in_flight"])
    (replica,) = view.replicas
    assert (replica.up, replica.backend, replica.queued) == (True, "memory", st["queued"])


def test_engines_show_their_readings_health_and_breaker() -> None:
    st = status("memory-1-gw0")
    view = memory_view()
    by_url = {e.url: e for e in view.engines}
    assert set(by_url) == {u["url"] for u in st["upstreams"]}
    for u in st["upstreams"]:
        e = by_url[u["url"]]
        assert (e.healthy, e.breaker, e.gateway_in_flight) == (
            u["healthy"],
            u["breaker"],
            u["in_flight"],
        )
        load = st["engine_load"].get(u["url"])
        if load is None:  # the dead upstream: no reading
            assert not e.healthy
            assert (e.running, e.waiting, e.kv_usage, e.age_s) == (None, None, None, None)
        else:
            assert (e.running, e.waiting, e.kv_usage, e.age_s) == (
                load["running"],
                load["waiting"],
                load["kv_usage"],
                load["age_s"],
            )


def test_rates_are_counter_increases_over_the_seconds_between_polls() -> None:
    completed = 'velvetrope_requests_total{outcome="completed"'
    rejected = 'velvetrope_requests_total{outcome="rejected"'
    done = counter("memory-1-gw0", completed) - counter("memory-0-gw0", completed)
    shed = counter("memory-1-gw0", rejected) - counter("memory-0-gw0", rejected)
    routed = counter("memory-1-gw0", "velvetrope_routed_total") - counter(
        "memory-0-gw0", "velvetrope_routed_total"
    )
    assert (done, shed, routed) == (4.0, 8.0, 18.0)  # what the recording holds
    for dt in (1.0, 2.0):
        view = memory_view(dt)
        rates = {(o.outcome, o.reason): o.per_s for o in view.outcomes}
        assert rates == {
            ("completed", "completed"): pytest.approx(done / dt),
            ("rejected", "queue_full"): pytest.approx(shed / dt),
        }
        assert view.arrived_per_s == pytest.approx(routed / dt)
        assert view.rejected_per_s == pytest.approx(shed / dt)
        assert view.admitted_per_s == pytest.approx((routed - shed) / dt)
    totals = {(o.outcome, o.reason): o.total for o in memory_view().outcomes}
    assert totals == {("completed", "completed"): 23, ("rejected", "queue_full"): 37}


def test_tenant_rates_need_the_tenant_label() -> None:
    view = memory_view()
    assert view.tenant_rates
    rates = {t.name: (t.done_per_s, t.rejected_per_s) for t in view.tenants}
    assert rates == {"gold": (4.0, 0.0), "silver": (0.0, 0.0), "bronze": (0.0, 8.0)}
    fleet = build_view([sample("redis-1-gw0", GW, 1.0)], {GW: sample("redis-0-gw0", GW, 0.0)})
    assert not fleet.tenant_rates
    assert all(t.done_per_s is None and t.rejected_per_s is None for t in fleet.tenants)


def test_band_wait_is_the_mean_wait_of_the_requests_that_ended() -> None:
    wait_sum = 'velvetrope_queue_wait_seconds_sum{tier="interactive"}'
    wait_n = 'velvetrope_queue_wait_seconds_count{tier="interactive"}'
    dsum = counter("memory-1-gw0", wait_sum) - counter("memory-0-gw0", wait_sum)
    dn = counter("memory-1-gw0", wait_n) - counter("memory-0-gw0", wait_n)
    waits = {b.name: b.wait_s for b in memory_view().bands}
    assert dn == 4.0
    assert waits == {"interactive": pytest.approx(dsum / dn), "standard": None, "batch": None}


def test_no_previous_poll_means_no_rates_but_totals() -> None:
    view = build_view([sample("memory-1-gw0", GW, 1.0)], {})
    assert (view.arrived_per_s, view.admitted_per_s, view.rejected_per_s) == (None, None, None)
    assert all(o.per_s is None for o in view.outcomes)
    assert sum(o.total for o in view.outcomes) == 60
    assert all(b.wait_s is None for b in view.bands)


def test_a_counter_that_went_down_restarted_from_zero() -> None:
    metrics = parse_metrics('velvetrope_routed_total{pool="default",rule="default"} 5\n')
    before = parse_metrics('velvetrope_routed_total{pool="default",rule="default"} 90\n')
    now = Sample(GW, 2.0, {}, metrics)
    view = build_view([now], {GW: Sample(GW, 0.0, {}, before)})
    assert view.arrived_per_s == pytest.approx(2.5)


def test_a_series_absent_before_counted_from_zero() -> None:
    line = 'velvetrope_requests_total{outcome="rejected",reason="rate_limited",tier="b"} 6\n'
    now = Sample(GW, 3.0, {}, parse_metrics(line))
    view = build_view([now], {GW: Sample(GW, 0.0, {}, parse_metrics(""))})
    assert [(o.reason, o.per_s, o.total) for o in view.outcomes] == [("rate_limited", 2.0, 6)]


@pytest.mark.parametrize(
    ("sort", "reverse", "order"),
    [
        ("queued", False, ["silver", "bronze", "gold"]),  # 20, 6, 6 (ties by name)
        ("queued", True, ["gold", "bronze", "silver"]),
        ("bucket", False, ["bronze", "gold", "silver"]),  # token fill 100 %, 100 %, none
        ("rejected", False, ["bronze", "gold", "silver"]),  # 8/s, then 0/s by name
        ("tenant", False, ["bronze", "gold", "silver"]),
        ("tenant", True, ["silver", "gold", "bronze"]),
    ],
)
def test_tenants_sort_by_the_chosen_column(sort: str, reverse: bool, order: list[str]) -> None:
    view = memory_view(controls=Controls(sort=sort, reverse=reverse))
    assert [t.name for t in view.tenants] == order


def test_every_sort_column_is_a_different_order_somewhere() -> None:
    # each column of SORTS sorts by something of its own: no two give the same order on
    # tenants built to tell them apart
    base = status("memory-1-gw0")
    st = dict(base)
    st["tenants_queued"] = {"a": 1, "b": 3, "c": 2}
    st["buckets"] = {"tenant:a:tok": 10.0, "tenant:b:tok": 30.0, "tenant:c:tok": 5.0}
    fills = "".join(
        f'velvetrope_bucket_fill_ratio{{bucket="tenant:{t}:tok"}} {f}\n'
        for t, f in (("a", 0.5), ("b", 0.9), ("c", 0.1))
    )
    before = "".join(
        f'velvetrope_requests_total{{outcome="rejected",reason="r",tenant="{t}",tier="x"}} 0\n'
        for t in "abc"
    )
    after = "".join(
        f'velvetrope_requests_total{{outcome="rejected",reason="r",tenant="{t}",tier="x"}} {n}\n'
        for t, n in (("a", 9), ("b", 1), ("c", 4))
    )
    orders = set()
    for sort in SORTS:
        view = build_view(
            [Sample(GW, 1.0, st, parse_metrics(fills + after))],
            {GW: Sample(GW, 0.0, st, parse_metrics(before))},
            Controls(sort=sort),
        )
        orders.add(tuple(t.name for t in view.tenants))
    assert orders == {("b", "c", "a"), ("c", "a", "b"), ("a", "c", "b"), ("a", "b", "c")}


def test_a_tenant_filter_keeps_its_tenants_and_leaves_the_pools() -> None:
    view = memory_view(controls=Controls(filter="BRON"))
    assert [t.name for t in view.tenants] == ["bronze"]
    assert [p.name for p in view.pools] == ["default"]
    assert len(view.engines) == 3


def test_a_pool_filter_keeps_its_pools_and_leaves_the_tenants() -> None:
    st = status("memory-1-gw0")
    st["pools"]["long"] = dict(st["pools"]["default"], queued=7)
    st["upstreams"] = [*st["upstreams"], dict(st["upstreams"][0], pool="long", url="http://x")]
    view = build_view([Sample(GW, 1.0, st, None)], {}, Controls(filter="lon"))
    assert [p.name for p in view.pools] == ["long"]
    assert [e.url for e in view.engines] == ["http://x"]
    assert {t.name for t in view.tenants} == {"bronze", "gold", "silver"}
    both = build_view([Sample(GW, 1.0, st, None)], {})
    assert [p.name for p in both.pools] == ["default", "long"]
    assert sum(b.queued for b in both.bands) == st["pools"]["default"]["queued"] * 2


def test_a_filter_that_names_nothing_filters_nothing() -> None:
    assert memory_view(controls=Controls(filter="nobody")) == replace(
        memory_view(), controls=Controls(filter="nobody")
    )


def test_missing_fields_are_zero_or_unknown_never_an_error() -> None:
    view = build_view([Sample(GW, 1.0, {}, None)], {})
    assert (view.pools, view.bands, view.tenants, view.engines, view.outcomes) == (
        [],
        [],
        [],
        [],
        [],
    )
    assert (view.queued, view.in_flight, view.up) == (0, 0, 1)
    sparse = {
        "pools": {"p": {"queued": 3, "bands": {"b": {}}}},
        "upstreams": [{"url": "http://e"}],
        "engine_load": {"http://e": {"running": 1}},  # no age: no reading to trust
        "state": {"backend": "redis"},
        "buckets": {"tenant:t:tok": "bad"},
    }
    view = build_view([Sample(GW, 1.0, sparse, None)], {})
    (p,) = view.pools
    assert (p.queued, p.in_flight, p.max_in_flight, p.drain_tokens_per_s, p.predicted_wait_s) == (
        3,
        0,
        None,
        None,
        None,
    )
    assert [(b.name, b.queued, b.tokens) for b in view.bands] == [("b", 0, 0)]
    (e,) = view.engines
    assert (e.pool, e.healthy, e.breaker, e.running) == ("", False, "?", None)
    (r,) = view.replicas
    assert (r.backend, r.state_up, r.replicas, r.outbox, r.fallbacks) == ("redis", None, 0, 0, None)
    assert view.tenants == []


def test_a_gateway_that_did_not_answer_is_down_and_counts_for_nothing() -> None:
    down = Sample(GW_B, 1.0, None, None, "unreachable")
    alone = memory_view()
    view = build_view(
        [sample("memory-1-gw0", GW, 1.0), down], {GW: sample("memory-0-gw0", GW, 0.0)}
    )
    assert [(r.url, r.up, r.error) for r in view.replicas] == [
        (GW, True, None),
        (GW_B, False, "unreachable"),
    ]
    assert view.up == 1
    assert (view.pools, view.tenants, view.arrived_per_s) == (
        alone.pools,
        alone.tenants,
        alone.arrived_per_s,
    )


def test_a_gateway_that_answered_401_is_alive_but_unread() -> None:
    denied = Sample(GW_B, 1.0, None, None, DENIED)
    view = build_view(
        [sample("memory-1-gw0", GW, 1.0), denied], {GW: sample("memory-0-gw0", GW, 0.0)}
    )
    assert [(r.url, r.up, r.denied) for r in view.replicas] == [
        (GW, True, False),
        (GW_B, False, True),
    ]
    assert view.up == 2  # both answered: one of them wants the admin token
    unreachable = build_view([Sample(GW_B, 1.0, None, None, "unreachable")], {})
    assert (unreachable.up, unreachable.replicas[0].denied) == (0, False)


def fleet() -> View:
    return build_view(
        [sample("redis-1-gw0", GW, 1.0), sample("redis-1-gw1", GW_B, 1.0)],
        {GW: sample("redis-0-gw0", GW, 0.0), GW_B: sample("redis-0-gw1", GW_B, 0.0)},
    )


def test_a_fleet_sums_its_gateways_and_holds_one_shared_limit() -> None:
    a, b = status("redis-1-gw0"), status("redis-1-gw1")
    view = fleet()
    (p,) = view.pools
    assert p.queued == a["queued"] + b["queued"]
    assert p.in_flight == a["in_flight"] + b["in_flight"]
    assert p.max_in_flight == max(
        a["pools"]["default"]["max_in_flight"], b["pools"]["default"]["max_in_flight"]
    )
    assert p.held == a["state"]["leases"]["default"] + b["state"]["leases"]["default"]
    assert {t.name: t.queued for t in view.tenants} == {"bronze": 4, "gold": 22, "silver": 23}
    lowest = min(a["buckets"]["tenant:bronze:req"], b["buckets"]["tenant:bronze:req"])
    assert next(t for t in view.tenants if t.name == "bronze").requests == lowest
    assert [(r.backend, r.replicas, r.fleet_queued) for r in view.replicas] == [
        ("redis", 2, a["state"]["fleet_queue_depth"]),
        ("redis", 2, b["state"]["fleet_queue_depth"]),
    ]
    rej = sum(
        counter(f"redis-1-gw{j}", 'velvetrope_requests_total{outcome="rejected"')
        - counter(f"redis-0-gw{j}", 'velvetrope_requests_total{outcome="rejected"')
        for j in (0, 1)
    )
    assert view.rejected_per_s == pytest.approx(rej)


def test_gateways_with_their_own_state_add_their_limits() -> None:
    one = sample("memory-1-gw0", GW, 1.0)
    view = build_view([one, replace(one, url=GW_B)], {})
    (p,) = view.pools
    assert p.max_in_flight == 2 * status("memory-1-gw0")["pools"]["default"]["max_in_flight"]
    assert p.held is None


def test_an_engine_shows_the_freshest_reading_and_the_worst_breaker() -> None:
    a, b = status("redis-1-gw0"), status("redis-1-gw1")
    url = a["upstreams"][0]["url"]
    b["upstreams"] = [dict(u, breaker="open") if u["url"] == url else u for u in b["upstreams"]]
    view = build_view([Sample(GW, 1.0, a, None), Sample(GW_B, 1.0, b, None)], {})
    e = next(e for e in view.engines if e.url == url)
    assert e.breaker == "open"
    fresher = min((a, b), key=lambda s: s["engine_load"][url]["age_s"])
    assert (e.age_s, e.kv_usage) == (
        fresher["engine_load"][url]["age_s"],
        fresher["engine_load"][url]["kv_usage"],
    )
    assert e.gateway_in_flight == sum(
        u["in_flight"] for s in (a, b) for u in s["upstreams"] if u["url"] == url
    )
    b["upstreams"] = [dict(u, healthy=False) if u["url"] == url else u for u in b["upstreams"]]
    view = build_view([Sample(GW, 1.0, a, None), Sample(GW_B, 1.0, b, None)], {})
    assert not next(e for e in view.engines if e.url == url).healthy


def test_buckets_other_than_tenants_have_their_own_rows() -> None:
    st = status("memory-1-gw0")
    st["buckets"] = dict(st["buckets"], **{"tier:batch:tok": 12.5, "model:m:x:req": 3.0})
    fill = 'velvetrope_bucket_fill_ratio{bucket="tier:batch:tok"} 0.25\n'
    view = build_view([Sample(GW, 1.0, st, parse_metrics(fill))], {})
    assert [(b.key, b.level, b.fill) for b in view.buckets] == [
        ("model:m:x:req", 3.0, None),
        ("tier:batch:tok", 12.5, 0.25),
    ]
    assert "batch" not in {t.name for t in view.tenants}


def budget(scope: str, used: float, **kw: object) -> dict[str, object]:
    key = f"quota:{scope}:day:2026-12-07:tok"
    return {"key": key, "scope": scope, "window": "day", "unit": "tok", "used": used,
            "limit": 1000.0, "reset_s": 3600.0, **kw}  # fmt: skip


def test_budgets_show_their_burn_the_most_used_over_gateways_not_as_buckets() -> None:
    a, b = status("redis-1-gw0"), status("redis-1-gw1")
    a["budgets"] = [budget("acme", 250.0), budget("globex", 1200.0)]
    b["budgets"] = [budget("acme", 400.0), {"key": "quota:x:day:d:tok", "used": "?"}]
    a["buckets"] = dict(a["buckets"], **{"quota:acme:day:2026-12-07:tok": 750.0})
    view = build_view([Sample(GW, 1.0, a, None), Sample(GW_B, 1.0, b, None)], {})
    got = [(r.scope, r.window, r.used, r.limit, r.share, r.reset_s) for r in view.budgets]
    assert got == [
        ("acme", "day", 400.0, 1000.0, 0.4, 3600.0),
        ("globex", "day", 1200.0, 1000.0, 1.2, 3600.0),
    ]
    assert not any(k.key.startswith("quota:") for k in view.buckets)
    filtered = build_view([Sample(GW, 1.0, a, None)], {}, Controls(filter="glob"))
    assert [r.scope for r in filtered.budgets] == ["globex"]


def test_recorded_metrics_parse_to_the_samples_written() -> None:
    m = parse_metrics(text("memory-1-gw0"))
    assert m.value("velvetrope_in_flight", pool="default") == 4.0
    assert m.value("velvetrope_requests_total", outcome="rejected") == 37.0
    assert m.value("velvetrope_requests_total", tenant="gold") == 16.0
    assert m.value("velvetrope_requests_total", tenant="nobody") is None
    assert m.value("process_cpu_seconds_total") is None  # not ours: never read
    sums = {d["tier"]: v for d, v in m.series("velvetrope_queue_wait_seconds_count")}
    assert sums == {"interactive": 16.0, "standard": 3.0, "batch": 4.0}
    n = sum(1 for line in text("memory-1-gw0").splitlines() if re.match(r"velvetrope_\w", line))
    assert sum(len(v) for v in m.samples.values()) == n


def test_metrics_escapes_and_bad_lines() -> None:
    m = parse_metrics('velvetrope_x{a="q\\"uote\\n"} 1.5\nother_metric{ 2\n')
    assert m.value("velvetrope_x", a='q"uote\n') == 1.5
    with pytest.raises(ValueError, match=r".+"):
        parse_metrics("velvetrope_x{a= 1\n")


def _with_endpoints(chat: int, emb: int) -> str:
    head = 'velvetrope_requests_total{tier="batch",outcome="completed",reason="completed",'
    return (
        f'{head}endpoint="chat"}} {chat}\n'
        f'{head}endpoint="embeddings"}} {emb}\n'
        'velvetrope_requests_total{tier="batch",outcome="rejected",reason="queue_full",'
        'endpoint="embeddings"} 2\n'
    )


def test_requests_by_endpoint_kind_have_rates_and_totals_in_the_outcomes_table() -> None:
    st = status("memory-1-gw0")
    before = Sample(GW, 0.0, st, parse_metrics(_with_endpoints(10, 100)))
    now = Sample(GW, 2.0, st, parse_metrics(_with_endpoints(14, 160)))
    view = build_view([now], {GW: before})
    assert [(e.outcome, e.per_s, e.total) for e in view.endpoints] == [
        ("embeddings", 30.0, 162),
        ("chat", 2.0, 14),
    ]
    assert build_view([now], {}).endpoints[0].per_s is None  # no previous poll: totals only
    rows = sections(view)[2][1].rows
    assert [str(r[0]) for r in rows[-2:]] == ["endpoint embeddings", "endpoint chat"]
    # a gateway without the label (recorded before it existed) shows no endpoint rows
    assert memory_view().endpoints == []
