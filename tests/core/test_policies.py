"""Ordering, fairness and band policies, and a scenario per preset showing what it is for."""

from __future__ import annotations

from statistics import mean
from typing import Any

import pytest

from velvetrope.core import Job, PolicyConfig, apply_preset, preset_names
from velvetrope.core.fairness import VirtualTokenCounter
from velvetrope.errors import PolicyError

from .helpers import controller, make_job, run_fleet

TPOT = 0.01  # seconds per output token in these single-slot scenarios


def service(job: Job) -> float:
    return (job.predicted_output or 1) * TPOT


def one_slot(preset: str, **extra: Any) -> dict[str, Any]:
    return {"preset": preset, "pools": [{"name": "default", "max_in_flight": 1}], **extra}


def test_unknown_names_are_refused() -> None:
    with pytest.raises(PolicyError, match="preset"):
        controller({"preset": "nope"})
    with pytest.raises(PolicyError, match="ordering"):
        controller({"queue": {"ordering": "nope"}})
    with pytest.raises(PolicyError, match="fairness"):
        controller({"queue": {"fairness": "nope"}})
    assert set(preset_names()) >= {"fifo", "sjf", "sjf_aging", "priority", "fair", "hybrid"}


def test_explicit_queue_fields_win_over_the_preset() -> None:
    cfg = apply_preset(
        PolicyConfig.model_validate({"preset": "sjf_aging", "queue": {"aging_s": 3}})
    )
    assert cfg.queue.ordering == "sjf_aging" and cfg.queue.aging_s == 3
    two_tiers = {"preset": "hybrid", "tiers": [{"name": "a"}, {"name": "b"}]}
    hy = apply_preset(PolicyConfig.model_validate(two_tiers))
    assert [t.weight for t in hy.tiers] == [10.0, 1.0]


def _mixed_arrivals() -> list[tuple[float, Job]]:
    sizes = [500, 20, 300, 10, 700, 15, 40, 200, 5, 600] * 3
    return [(0.0, make_job(predicted=s, max_tokens=1000)) for s in sizes]


def _mean_latency(order: list[Job]) -> float:
    t = 0.0
    lat = []
    for j in order:
        t += service(j)
        lat.append(t)
    return mean(lat)


def test_fifo_serves_in_arrival_order_whatever_the_size_or_tier() -> None:
    ctl, clock = controller(one_slot("fifo", tiers=[{"name": "gold"}, {"name": "bronze"}]))
    arrivals = [
        (i * 0.001, make_job(tier="gold" if i % 2 else "bronze", predicted=1000 - i * 10))
        for i in range(20)
    ]
    order = run_fleet(ctl, clock, arrivals, service)
    assert order == [j for _, j in arrivals]


def test_sjf_lowers_mean_latency_against_fifo() -> None:
    results = {}
    for preset in ("fifo", "sjf"):
        ctl, clock = controller(one_slot(preset))
        order = run_fleet(ctl, clock, _mixed_arrivals(), service)
        results[preset] = _mean_latency(order)
        if preset == "sjf":
            assert [j.predicted_output for j in order[1:]] == sorted(
                j.predicted_output or 0 for j in order[1:]
            )
    assert results["sjf"] < 0.6 * results["fifo"]


def _starvation_run(
    preset: str, horizon: float, queue: dict[str, Any] | None = None
) -> tuple[Job, list[Job]]:
    """Shorts arrive exactly as fast as they are served (rho = 1 on their own), with a
    backlog of 5 at t=0; one long job arrives at t=0.05.  ``queue`` overrides the preset."""
    ctl, clock = controller(one_slot(preset, **({"queue": queue} if queue else {})))
    short_s = 10 * TPOT
    arrivals = [(0.0, make_job(predicted=10)) for _ in range(5)]
    arrivals += [(k * short_s, make_job(predicted=10)) for k in range(1, int(horizon / short_s))]
    long = make_job(predicted=1000, max_tokens=1000)
    arrivals.append((0.05, long))
    order = run_fleet(ctl, clock, arrivals, service, until=horizon)
    return long, order


def test_sjf_starves_a_long_job_under_an_endless_stream_of_shorts() -> None:
    long, order = _starvation_run("sjf", horizon=120.0)
    assert long not in order


@pytest.mark.parametrize("preset", ["sjf_aging", "hybrid"])
def test_aging_bounds_the_long_jobs_wait_at_the_presets_15_s(preset: str) -> None:
    # No queue fields given: the preset's own aging_s (15 s) and ordering are under test.
    long, order = _starvation_run(preset, horizon=120.0)
    assert long in order
    assert long.dispatched_at is not None
    wait = long.dispatched_at - long.arrival
    # The long job's key is arrival + aging_s; every job arriving after that key is behind
    # it, so it waits at most aging_s plus the drain of the initial backlog and one job.
    bound = 15.0 + (5 + 2) * 10 * TPOT
    assert wait <= bound
    assert wait >= 15.0 - 1.0  # and aging is what got it there, not luck


def test_priority_puts_the_top_tier_first() -> None:
    ctl, clock = controller(one_slot("priority", tiers=[{"name": "gold"}, {"name": "bronze"}]))
    arrivals = [(0.0, make_job("b", "bronze")) for _ in range(10)]
    gold = make_job("g", "gold")
    arrivals.append((0.01, gold))
    order = run_fleet(ctl, clock, arrivals, service)
    assert order.index(gold) == 1  # right after the one already running


def test_priority_min_share_bounds_a_lower_bands_starvation() -> None:
    tiers = [{"name": "gold"}, {"name": "bronze", "min_share": 0.2}]
    ctl, clock = controller(one_slot("priority", tiers=tiers))
    arrivals = [(0.0, make_job("g", "gold")) for _ in range(50)]
    arrivals += [(0.0, make_job("b", "bronze")) for _ in range(10)]
    order = run_fleet(ctl, clock, arrivals, service)
    bronze_pos = [i for i, j in enumerate(order) if j.tier == "bronze"]
    gaps = [b - a for a, b in zip([1, *bronze_pos], bronze_pos, strict=False)]
    assert max(gaps) <= 5  # ceil(1 / 0.2) queue dispatches (order[0] started at once)


def test_fair_keeps_a_light_tenant_from_waiting_behind_a_heavy_one() -> None:
    ctl, clock = controller(one_slot("fair"))
    arrivals = [(0.0, make_job("heavy", predicted=100)) for _ in range(100)]
    light = [make_job("light", predicted=100) for _ in range(5)]
    arrivals += [(0.5, j) for j in light]
    order = run_fleet(ctl, clock, arrivals, service)
    positions = [order.index(j) for j in light]
    assert max(positions) <= 15  # interleaved, not after the 100 heavy jobs

    ctl, clock = controller(one_slot("fifo"))
    arrivals = [(0.0, make_job("heavy", predicted=100)) for _ in range(100)]
    light = [make_job("light", predicted=100) for _ in range(5)]
    arrivals += [(0.5, j) for j in light]
    order = run_fleet(ctl, clock, arrivals, service)
    assert min(order.index(j) for j in light) >= 100  # what 'fair' prevents


def _vtc_max_gap(preset: str) -> tuple[float, float]:
    w_in, w_out = 1.0, 2.0
    cfg = {
        "preset": preset,
        "queue": {"vtc_input_weight": w_in, "vtc_output_weight": w_out},
        "pools": [{"name": "default", "max_in_flight": 8, "max_tokens_in_flight": 4000}],
    }
    ctl, clock = controller(cfg)
    # Tenant A: short prompts, long outputs; B: long prompts, short outputs. Both stay
    # backlogged throughout.  A floods first, which a non-fair queue would serve first.
    arrivals = [(0.0, make_job("A", prompt=100, predicted=300, max_tokens=300)) for _ in range(300)]
    arrivals += [(0.0, make_job("B", prompt=1000, predicted=50, max_tokens=50)) for _ in range(300)]
    served = {"A": 0.0, "B": 0.0}
    gap = 0.0

    def svc(j: Job) -> float:
        nonlocal gap
        served[j.tenant] += w_in * j.prompt_tokens + w_out * (j.predicted_output or 0)
        gap = max(gap, abs(served["A"] - served["B"]))
        return (j.predicted_output or 1) * TPOT

    run_fleet(ctl, clock, arrivals, svc, until=20.0)  # both tenants backlogged until then
    l_in, m = 1000, 4000
    return gap, 2 * max(w_in * l_in, w_out * m)


def test_vtc_service_gap_stays_within_the_papers_bound() -> None:
    gap, bound = _vtc_max_gap("fair")
    assert gap <= bound
    gap_fifo, _ = _vtc_max_gap("fifo")
    assert gap_fifo > bound  # the bound is not vacuous: without VTC it is broken


def test_vtc_lifts_a_newly_backlogged_tenant() -> None:
    from velvetrope.core.policy import QueuePolicy

    v = VirtualTokenCounter(QueuePolicy(), lambda t: 1.0)
    a = make_job("a", prompt=100, predicted=100)
    a.seq = 1
    from velvetrope.core import JobState

    a.state = JobState.QUEUED
    v.push(a, 0.0)
    assert v.peek() is a
    v.pop()
    assert v.counters["a"] == 300.0
    b1 = make_job("a", prompt=100, predicted=100)
    b1.seq, b1.state = 2, JobState.QUEUED
    v.push(b1, 0.0)
    late = make_job("late", prompt=1, predicted=1)
    late.seq, late.state = 3, JobState.QUEUED
    v.push(late, 0.0)
    assert v.counters["late"] == 300.0  # lifted to the backlogged minimum: no banked credit


def test_hybrid_combines_tier_weight_fairness_and_short_first() -> None:
    tiers = [{"name": "gold"}, {"name": "bronze"}]
    ctl, clock = controller(one_slot("hybrid", tiers=tiers))
    arrivals = [(0.0, make_job("g", "gold", prompt=0, predicted=100)) for _ in range(200)]
    arrivals += [(0.0, make_job("b", "bronze", prompt=0, predicted=100)) for _ in range(200)]
    order = run_fleet(ctl, clock, arrivals, service, until=30.0)
    first = order[1:111]
    gold = sum(1 for j in first if j.tier == "gold")
    bronze = len(first) - gold
    assert bronze >= 1  # lower band is never starved
    assert gold / bronze == pytest.approx(10.0, rel=0.25)  # top tier at 10x weight

    ctl, clock = controller(one_slot("hybrid"))
    longs = [make_job("t", predicted=800, max_tokens=1000) for _ in range(5)]
    shorts = [make_job("t", predicted=150, max_tokens=1000) for _ in range(5)]
    arrivals = [(0.0, j) for j in longs] + [(0.001, j) for j in shorts]
    order = run_fleet(ctl, clock, arrivals, service)
    assert order[1:6] == shorts  # short completions go first inside a tenant


def test_vtc_counts_jobs_that_started_without_queueing() -> None:
    from velvetrope.core import Usage
    from velvetrope.core.fairness import VirtualTokenCounter

    ctl, _ = controller({"preset": "fair", "pools": [{"name": "default", "max_in_flight": 2}]})
    a1 = make_job("A", prompt=100, predicted=100)
    ctl.arrive(a1)  # starts at once, never queued
    ctl.complete(a1.id, Usage(100, 40))
    band = ctl._pools["default"].sched.bands[0].queue
    assert isinstance(band, VirtualTokenCounter)
    # the counter is the service received: w_in·prompt + w_out·actual output (1·100 + 2·40)
    assert band.counters["A"] == pytest.approx(180.0)


# --------------------------------------------------------------------------- EDF


def _edf_order(tiers: list[dict[str, Any]], jobs: list[tuple[float, Job]]) -> list[Job]:
    cfg = one_slot("fifo", tiers=tiers, queue={"ordering": "edf"})
    ctl, clock = controller(cfg)
    blocker = make_job(tier=tiers[0]["name"], predicted=100)
    return run_fleet(ctl, clock, [(0.0, blocker), *jobs], service)[1:]


def test_edf_takes_its_deadlines_from_the_tiers() -> None:
    # One band for both tiers: a batch job queued first, an interactive one a second later.
    # EDF serves the one whose tier deadline comes first (FCFS would serve batch first).
    by_wait: list[dict[str, Any]] = [
        {"name": "interactive", "max_wait_s": 2.0},
        {"name": "batch", "max_wait_s": 60},
    ]
    by_ttft: list[dict[str, Any]] = [
        {"name": "interactive", "slo": {"ttft_s": 2.0}},
        {"name": "batch", "slo": {"e2e_s": 60.0}},
    ]
    for both in (by_wait, by_ttft):
        batch = make_job(tier="batch", predicted=10)
        inter = make_job(tier="interactive", predicted=10)
        assert _edf_order(both, [(0.0, batch), (0.5, inter)]) == [inter, batch]
    # a tier without a deadline goes after every job that has one
    tiers: list[dict[str, Any]] = [{"name": "interactive", "max_wait_s": 30.0}, {"name": "batch"}]
    batch = make_job(tier="batch", predicted=10)
    inter = make_job(tier="interactive", predicted=10)
    assert _edf_order(tiers, [(0.0, batch), (0.5, inter)]) == [inter, batch]


def test_edf_keeps_a_jobs_own_earlier_deadline() -> None:
    tiers = [{"name": "t", "max_wait_s": 60.0}]
    late = make_job(tier="t", predicted=10)
    urgent = make_job(tier="t", predicted=10, deadline=3.0)  # before its tier's 60 s
    assert _edf_order(tiers, [(0.0, late), (0.5, urgent)]) == [urgent, late]


def test_deadline_budgets() -> None:
    from velvetrope.core.ordering import deadline_budgets

    cfg = PolicyConfig.model_validate(
        {
            "tiers": [
                {"name": "a", "max_wait_s": 5, "slo": {"ttft_s": 1}},
                {"name": "b", "slo": {"ttft_s": 1, "e2e_s": 9}},
                {"name": "c", "slo": {"e2e_s": 9}},
                {"name": "d", "slo": {"tpot_s": 0.1}},
            ]
        }
    )
    assert deadline_budgets(cfg) == {"a": 5.0, "b": 1.0, "c": 9.0}


# --------------------------------------------------------------------------- every preset
# parameter matters: each test below fails when the parameter it names is changed


@pytest.mark.parametrize("preset", ["sjf", "sjf_aging"])
def test_sjf_presets_order_by_size_alone_across_tiers_and_tenants(preset: str) -> None:
    # bands single: the gold tier gets no precedence; fairness none: tenant g, which queued
    # first, gets no turn before b's shorter jobs.
    ctl, clock = controller(one_slot(preset, tiers=[{"name": "gold"}, {"name": "bronze"}]))
    blocker = make_job("g", "gold", predicted=100)
    longs = [make_job("g", "gold", predicted=800, max_tokens=1000) for _ in range(3)]
    shorts = [make_job("b", "bronze", predicted=20) for _ in range(3)]
    arrivals = [(0.0, blocker), *((0.001, j) for j in longs), *((0.002, j) for j in shorts)]
    order = run_fleet(ctl, clock, arrivals, service)
    assert order == [blocker, *shorts, *longs]


def test_priority_is_strict_by_tier_and_fifo_inside_whatever_the_tenant_or_size() -> None:
    # bands strict (not weighted): every gold job before any bronze one; fairness none: g1's
    # jobs, queued first, all go before g2's; ordering fcfs: g2's tiny jobs do not jump.
    ctl, clock = controller(one_slot("priority", tiers=[{"name": "gold"}, {"name": "bronze"}]))
    blocker = make_job("b", "bronze", predicted=100)
    bronze = [make_job("b", "bronze", predicted=10) for _ in range(3)]
    g1 = [make_job("g1", "gold", predicted=500, max_tokens=500) for _ in range(3)]
    g2 = [make_job("g2", "gold", predicted=5) for _ in range(3)]
    arrivals = [(0.0, blocker), *((0.001, j) for j in bronze)]
    arrivals += [(0.002, j) for j in g1] + [(0.003, j) for j in g2]
    assert run_fleet(ctl, clock, arrivals, service) == [blocker, *g1, *g2, *bronze]


def test_fair_ignores_tiers_and_keeps_each_tenants_own_order() -> None:
    # bands single: tenant b (bronze) is served alongside a (gold), not after all of it;
    # ordering fcfs: a's jobs go in the order a sent them, small ones do not jump.
    ctl, clock = controller(one_slot("fair", tiers=[{"name": "gold"}, {"name": "bronze"}]))
    blocker = make_job("a", "gold", predicted=100)
    a = [make_job("a", "gold", predicted=p, max_tokens=500) for p in (500, 10, 500, 10)]
    b = [make_job("b", "bronze", predicted=100) for _ in range(4)]
    arrivals = [(0.0, blocker), *((0.001, j) for j in a), *((0.002, j) for j in b)]
    order = run_fleet(ctl, clock, arrivals, service)
    assert [j for j in order if j in a] == a
    assert order.index(b[0]) <= 3


def test_hybrid_shares_by_tokens_between_tenants_not_by_turns() -> None:
    # fairness vtc: A's jobs cost 1000 + 2 x 100 = 1200 counter units, B's 10 + 2 x 100 =
    # 210, so B gets about 5.7 dispatches per one of A's (round robin: 1 to 1; none: A's
    # backlog, queued first, goes first).
    ctl, clock = controller(one_slot("hybrid"))
    blocker = make_job("A", prompt=1000, predicted=100)
    heavy = [make_job("A", prompt=1000, predicted=100, max_tokens=200) for _ in range(30)]
    light = [make_job("B", prompt=10, predicted=100, max_tokens=200) for _ in range(30)]
    arrivals = [(0.0, blocker), *((0.001, j) for j in heavy), *((0.002, j) for j in light)]
    first = run_fleet(ctl, clock, arrivals, service)[1:21]
    n_a = sum(j.tenant == "A" for j in first)
    assert n_a >= 1 and 20 - n_a >= 4 * n_a


@pytest.mark.parametrize(("short_at", "short_first"), [(1.5, True), (2.2, False)])
def test_hybrid_boosts_completions_under_200_tokens_3x(short_at: float, short_first: bool) -> None:
    # sjf_aging keys: arrival + 15 s x min(1, cost/1000).  A 200-token job (not short: the
    # bound is strict) queued at t = 0 has key 3.0; a 190-token one, short and boosted 3x,
    # has key t + 15 x 63.3/1000 = t + 0.95.  Queued at t = 1.5 it goes first (2.45 < 3.0;
    # without the boost 4.35 would not); at t = 2.2 it does not (3.15 > 3.0; a 6x boost,
    # 2.675, would).  So the test pins short_output_tokens = 200 and 1.9 < short_boost < 3.56.
    ctl, clock = controller(one_slot("hybrid"))
    blocker = make_job(predicted=300, max_tokens=1000)
    edge = make_job(prompt=0, predicted=200, max_tokens=1000)
    short = make_job(prompt=0, predicted=190, max_tokens=1000)
    arrivals = [(0.0, blocker), (0.0, edge), (short_at, short)]
    order = run_fleet(ctl, clock, arrivals, service)
    assert order[1:] == ([short, edge] if short_first else [edge, short])


@pytest.mark.parametrize("ordering", ["fcfs", "sjf", "sjf_aging", "edf"])
def test_each_ordering_keys_jobs_as_its_definition_says(ordering: str) -> None:
    """The compiled Ordering classes against the module's definitions (job_cost, arrival,
    deadline), for every ordering, with the prompt weight and the short boost on."""
    import random

    from velvetrope.core.ordering import job_cost, make_key, make_ordering
    from velvetrope.core.policy import QueuePolicy

    q = QueuePolicy(
        ordering=ordering,
        aging_s=15.0,
        aging_ref_tokens=500,
        short_output_tokens=200,
        short_boost=3.0,
        sjf_prompt_weight=0.25,
    )
    budgets = {"gold": 2.0}
    order, key = make_ordering(q, budgets), make_key(q, budgets)
    rng = random.Random(3)
    for _ in range(200):
        predicted = rng.choice([None, rng.randrange(1, 1000)])
        own = rng.choice([None, rng.random() * 10])
        job = make_job(
            "t",
            rng.choice(["gold", "bronze"]),
            prompt=rng.randrange(0, 4000),
            max_tokens=rng.randrange(1, 1000),
            predicted=predicted,
            deadline=own,
            arrival=rng.random() * 10,
        )
        if ordering == "fcfs":
            expected = job.arrival
        elif ordering == "sjf":
            expected = job_cost(job, q)
        elif ordering == "sjf_aging":
            expected = job.arrival + min(15.0, job_cost(job, q) * 15.0 / 500)
        else:
            d = job.arrival + 2.0 if job.tier == "gold" else float("inf")
            expected = min(d, own) if own is not None else d
        assert order.key(job) == pytest.approx(expected, rel=1e-12)
        assert key(job) == order.key(job)
