"""The studies in ``experiments/`` import, and their core helpers work on tiny inputs.

The full studies take minutes and are not run here (``make studies`` runs them all); the
stamp rule of their reports and the verdict table generated from them are.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from experiments import common, index
from experiments.a_mean_latency import run as a
from experiments.b_aging import run as b
from experiments.c_split_pools import run as c
from experiments.common import (
    Report,
    at_load,
    capacity_at,
    engine_profile,
    mean_of,
    pct,
    pctl,
    poisson_workload,
    save_plot,
    split_stamp,
)
from experiments.d_queue_depth import run as d
from experiments.e_edge_buckets import run as e
from experiments.f_overload import run as f
from experiments.g_predicted_split import run as g
from experiments.h_saturation import run as h
from experiments.i_degradation import run as i
from experiments.l_prefix import run as l_prefix
from experiments.m_fintech import run as m
from experiments.n_engine_priority import run as n
from velvetrope.core.presets import apply_preset
from velvetrope.errors import ConfigError
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace
from velvetrope.sim.workload import head


@pytest.fixture(scope="module")
def conv() -> list[TraceRequest]:
    return load_trace("azure_conv")


def test_common_helpers() -> None:
    assert math.isnan(pctl([], 99))
    assert math.isnan(mean_of([math.nan]))
    assert pctl([1.0, math.nan, 3.0], 50) == 2.0
    assert pct(-0.0001) == "0.0%"
    rep = Report("t", "v")
    rep.table(["a"], [["1"]])
    assert rep.render() == "# t\n\nv\n\n| a |\n| --- |\n| 1 |\n"


def test_theory_matches_the_brief(conv: list[TraceRequest]) -> None:
    # the brief's figures: about 33% (conversation) and 59% (code) at rho = 0.8
    assert a.theory_reduction(a.output_sizes(conv), 0.8) == pytest.approx(0.327, abs=0.005)
    code = load_trace("azure_code")
    assert a.theory_reduction(a.output_sizes(code), 0.8) == pytest.approx(0.590, abs=0.005)
    # equal sizes: nothing to reorder
    assert a.theory_reduction(np.full(100, 7, dtype=np.int64), 0.8) == pytest.approx(0.0)


def test_sjf_gains_with_one_slot_and_not_with_a_batch(conv: list[TraceRequest]) -> None:
    profile = engine_profile()
    base = poisson_workload(conv, 300, seed=1)
    knowledge = (("fifo", "oracle"), ("sjf", "oracle"))
    one = a.fleet_rows(
        at_load(base, 0.9, capacity_at(profile, conv, 1, 1)),
        profile,
        replicas=1,
        slots=1,
        knowledge=knowledge,
    )
    assert one[0].queue > 1.0
    assert one[1].e2e < 0.9 * one[0].e2e
    assert one[1].tau == pytest.approx(1.0)
    batch = a.fleet_rows(
        at_load(base, 0.5, capacity_at(profile, conv, 1, 64)),
        profile,
        replicas=1,
        slots=64,
        knowledge=knowledge,
    )
    assert batch[0].queue == 0.0
    assert batch[1].e2e == batch[0].e2e


def test_sjf_starves_the_longest_decile(conv: list[TraceRequest]) -> None:
    sizes = a.output_sizes(conv)
    points = b.analytic_points(sizes, 0.9, n_jobs=3000, warmup=100, progress=None)
    labels = [p.label for p in points]
    assert labels[0] == "fifo" and labels[-1] == "sjf"
    fifo, sjf = points[0], points[-1]
    assert sjf.mean_latency < fifo.mean_latency
    assert sjf.long_p99_wait > fifo.long_p99_wait
    assert 0.0 < b.gain_kept(points, labels.index("sjf_aging 240 s")) <= 1.2


def test_split_pool_search_and_pool_independence(conv: list[TraceRequest]) -> None:
    t = c.Tail
    grid = c.Grid(
        shared={4: (t(1.0, 5.0), t(1.0, 9.0)), 5: (t(0.4, 3.0), t(0.5, 8.0))},
        short={2: t(2.0, 6.0), 3: t(0.3, 2.0)},
        long={1: t(50.0, 90.0), 2: t(1.0, 10.0)},
    )
    assert grid.best_split(5, "ttft") == (3, 2)
    assert grid.best_split(4, "ttft") == (2, 2)  # (3, 1) breaks the long bound
    assert grid.gpus_for("ttft", 0.5) == (5, 5)
    assert grid.gpus_for("ttft", 0.1) == (None, None)
    # a two-pool run equals the two pools run apart (the study relies on it)
    profile = engine_profile()
    wl = at_load(head(conv, 400), 0.9, capacity_at(profile, conv, 2, 8))
    combined = c.combined_check(wl, 1, 1, 8, profile)
    short = c.tails(c.run([r for r in wl if c.is_short(r)], 1, 8, profile))
    long = c.tails(c.run([r for r in wl if not c.is_short(r)], 1, 8, profile))
    assert combined == (short, long)


def test_queue_bound_rejects_and_bounds_the_wait(conv: list[TraceRequest]) -> None:
    profile = engine_profile()
    wl = at_load(head(conv, 600), 1.3, capacity_at(profile, conv, d.REPLICAS, 4))
    unbounded = d.one_run(wl, profile, load=1.3, max_queued=None, slots=4)
    bounded = d.one_run(wl, profile, load=1.3, max_queued=10, slots=4)
    assert unbounded.rejected == 0.0
    assert bounded.rejected > 0.0
    assert bounded.wait_p99 < unbounded.wait_p99


def test_edge_bucket_scenario(conv: list[TraceRequest]) -> None:
    wl = e.build_workload(conv, 20.0, seed=1)
    t0, t1 = e.FLOOD
    flood = [r for r in wl if r.tenant == e.FLOODER and t0 <= r.t < t1]
    calm = [r for r in wl if r.tenant == e.FLOODER and r.t < t0]
    assert len(flood) / (t1 - t0) > 5 * len(calm) / t0
    cfgs = e.configs(20.0, 1366.0)
    assert [tier.name for tier in cfgs[e.VERSIONS[1]].tiers] == ["shared"]
    assert all(tn.limits is not None for tn in cfgs[e.VERSIONS[2]].tenants)
    assert cfgs[e.VERSIONS[3]].preset == "hybrid"


def test_overload_policies_and_summary(conv: list[TraceRequest]) -> None:
    assert f.policy("D").tiers[0].max_wait_s == f.SHEDDING["interactive"]["max_wait_s"]
    assert f.policy("A").pools[0].max_in_flight == f.ENGINE_SEQS * f.REPLICAS
    mix = TenantMix.parse(f.MIX)
    wl = mix.assign(head(conv, 2500), 0)  # about 25 s of arrivals at 1.5x
    no = f.run_policy("B", wl, 1.5, None)  # unbounded FIFO queue
    yes = f.run_policy("D", wl, 1.5, None)  # hybrid with shedding
    assert 0.0 <= no.goodput_frac < yes.goodput_frac <= 1.0
    assert no.tiers[0].goodput < 0.5 < 0.99 <= yes.tiers[0].goodput  # the interactive tier
    assert no.window_good[-1] < no.window_good[0]  # without admission it decays


def test_autoscaling_study_runs_a_case_on_a_short_day() -> None:
    from experiments.k_autoscaling import day
    from experiments.k_autoscaling import run as k

    work = day.day_workload(0.5, hours=0.25)
    assert work and max(r.t for r in work) < 900.0
    assert {r.tier for r in work} == {"interactive", "standard", "batch"}
    static = k.run_case(k.Case("static 2", static=2), work)
    assert static.peak == 2 and static.events == 0
    assert static.gpu_hours == pytest.approx(2 * 4 * 24.0)  # held for the whole day
    scaled = k.run_case(k.Case("qd", "queue_depth", 8.0, 90.0), work)
    assert scaled.peak >= k.MIN_REPLICAS == scaled.replicas_n[0]
    assert 0.0 <= scaled.attainment[0] <= 1.0
    assert scaled.replicas_t[0] == 0.0


def test_predicted_split_routes_through_the_core_and_picks_qualifying_splits() -> None:
    code = head(load_trace("azure_code"), 600)
    profile = engine_profile()
    wl = at_load(code, 0.8, capacity_at(profile, code, 2, 8))
    assert (g.predicted_short(wl, "oracle") == g.true_short(wl)).all()
    noisy = g.predicted_short(wl, "noisy:0.5")
    assert int((noisy != g.true_short(wl)).sum()) > 0  # a predictor makes mistakes
    res = g.routed(wl, 1, 1, "noisy:0.5")
    assert res.records.pool is not None
    assert ((res.records.pool == "short") == noisy).all()  # the core's rule, the same split

    def lat(short: list[float], long: list[float]) -> g.Lat:
        t = np.asarray(short + long)
        return g.Lat(t, 2 * t, np.asarray([True] * len(short) + [False] * len(long)))

    base = lat([1.0], [5.0])
    study = g.Study(
        shared={g.BASE_REPLICAS: base, 9: lat([0.8], [4.0])},
        splits={
            "x": g.Split(
                "x", 0.9, 0, 0,
                short={7: lat([0.5], []), 8: lat([0.3], [])},
                long={1: lat([], [9.0]), 2: lat([], [4.0])},
            )
        },
    )  # fmt: skip
    best = study.best("x", 9, "ttft")
    assert best is not None and best[:2] == (7, 2)  # 8 + 1 would leave long requests slower
    assert study.gpus_for(None, "ttft", 0.9) == 9
    assert study.gpus_for("x", "ttft", 0.4) is None


def test_saturation_study_measures_the_engines_waiting_lines(conv: list[TraceRequest]) -> None:
    assert not h.policy(h.STATIC_SLOTS, h.OFF).saturation.enabled
    assert h.policy(h.ENGINE_SEQS, h.ON).saturation.max_waiting == 2
    # 3,000 requests: long enough for the engines' own lines to build without the rule
    # (at 2,500 their p99 is 23, level with what the rule leaves: refills on their way in)
    wl = TenantMix.parse(f.MIX).assign(head(conv, 3000), 0)
    off = h.one(wl, h.ENGINE_SEQS, h.OFF, 1.3, "off", None)
    on = h.one(wl, h.ENGINE_SEQS, h.ON, 1.3, "on", None)
    assert on.waiting_p99 < off.waiting_p99
    assert on.ttft_p99[h.TOP] < off.ttft_p99[h.TOP]
    assert on.t.size == on.waiting_mean.size > 0


def test_degradation_study_caps_and_counts(conv: list[TraceRequest]) -> None:
    tiers = {t.name: t for t in i.policy(128, 0.5).tiers}
    assert tiers["interactive"].degrade is None
    deg = tiers["batch"].degrade
    assert deg is not None and deg.max_tokens == 128 and deg.wait_s == 12.5
    assert all(t.degrade is None for t in i.policy(None, 0.5).tiers)
    wl = TenantMix.parse(f.MIX).assign(head(conv, 2500), 0)
    plain = i.one(wl, None, 0.0, 1.5, None)
    capped = i.one(wl, 128, 0.1, 1.5, None)
    assert plain.cut == 0.0 and plain.degraded == 0.0
    assert capped.cut > 0 and 0 < capped.degraded < 1
    assert capped.full_goodput <= capped.goodput


def test_j_multi_template_workload_and_helpers() -> None:
    from experiments.j_adaptive import run as j
    from experiments.j_adaptive.templates import TEMPLATES, multi_template_workload

    times = [0.1 * i for i in range(400)]
    wl = multi_template_workload(times, 3)
    assert wl == multi_template_workload(times, 3)
    assert len({r.tenant for r in wl}) == 5
    for r in wl:
        tpl = TEMPLATES[r.prefix_id.split("/")[1]] if r.prefix_id else None
        assert tpl is not None
        assert r.max_tokens == tpl.max_tokens and 1 <= r.output_tokens <= tpl.max_tokens
        assert r.prompt_tokens + r.output_tokens <= 8192
    # a classifier answers short, a report writer long
    by = {n: [r.output_tokens for r in wl if str(r.prefix_id).endswith(n)] for n in TEMPLATES}
    assert max(by["classify"]) < min(by["report"])
    # requests in flight over busy time: two for 2% of it, then one
    assert j.in_flight_p95(np.array([0.0, 0.0]), np.array([10.0, 0.2])) == 1.0
    assert j.in_flight_p95(np.array([0.0, 0.0]), np.array([10.0, 10.0])) == 2.0
    profile = engine_profile()
    small = at_load(wl[:300], 0.9, capacity_at(profile, wl[:300], j.REPLICAS, j.SLOTS))
    fifo = j.run_one(small, profile, "fifo", 8, "oracle")
    ad = j.run_one(small, profile, "sjf_aging", None, "predicted")
    assert fifo.mode == "8" and ad.mode == "adaptive"
    assert fifo.in_flight_p95 <= 8 * j.REPLICAS
    assert math.isnan(fifo.tau) and -1 <= ad.tau <= 1
    assert j.gain(fifo, fifo) == 0.0
    assert j.kept(fifo, fifo, ad) != j.kept(fifo, fifo, ad)  # no oracle gain: nan


def test_l_prefix_sharing_workload_ceiling_and_routing(conv: list[TraceRequest]) -> None:
    work = l_prefix.shared_workload(conv[:2000])
    support = [r for r in work if r.tenant == "support"]
    assert abs(len(support) / len(work) - l_prefix.SHARE) < 0.05
    assert all(r.prefix_id == "system:support" for r in support)
    assert all(r.prefix_id is None for r in work if r.tenant == "other")
    # the unbounded cache: a block hits only when it and every block before it were seen
    reqs = [
        TraceRequest(
            t=0.0, prompt_tokens=1000, output_tokens=1, block_hashes=(1, 2), block_tokens=512
        ),
        TraceRequest(
            t=1.0, prompt_tokens=1000, output_tokens=1, block_hashes=(1, 3), block_tokens=512
        ),
        TraceRequest(
            t=2.0, prompt_tokens=600, output_tokens=1, block_hashes=(9, 2), block_tokens=512
        ),
    ]
    assert l_prefix.unbounded_hit_rate(reqs) == pytest.approx(512 / 2600)
    moon = l_prefix.mooncake(2.0)
    prof = l_prefix.mooncake_profile(1.0)
    rows = {m: l_prefix.run_routing(m, moon, 2, prof) for m in ("least_loaded", "oracle")}
    assert rows["least_loaded"].done == rows["oracle"].done == len(moon)
    assert rows["oracle"].hit_rate >= rows["least_loaded"].hit_rate > 0
    tiered = l_prefix.run_routing(
        "prefix_affinity", l_prefix.with_tiers(moon, 2.0), 2, prof, tiers=True
    )
    assert set(tiered.tier_ttft_p99) == {"interactive", "standard", "batch"}


def test_m_fintech_workload_versions_and_search(conv: list[TraceRequest]) -> None:
    t = np.array([0.0, 37.5, 75.0, 112.5, 140.0])
    assert m.level(t).tolist() == [0.0, 0.5, 1.0, 0.5, 0.0]
    wl = m.build_workload(conv, seed=1, scale=0.02)  # 0.8 -> 8 req/s
    expected = sum(b + (p - b) * 0.5 for _, _, b, p in m.TENANTS) * 0.02 * m.DURATION_S
    assert 0.7 * expected < len(wl) < 1.3 * expected
    peak = [r for r in wl if m.PEAK[0] <= r.t < m.PEAK[1]]
    assert {r.tier for r in peak} == set(m.TIERS)
    profile = engine_profile()
    w = m.prompt_weight(profile, conv)
    assert 0.0 < w < 1.0  # a prompt token costs the GPU less than an output token
    cfgs = {v: m.config(v, 2, 10.0, 1000.0, w) for v in m.VERSIONS}
    assert [t.name for t in cfgs[m.V1].tiers] == ["shared"]
    assert cfgs[m.V3].queue.sjf_prompt_weight == pytest.approx(w)
    assert cfgs[m.V3_OUT].queue.sjf_prompt_weight == 0.0
    v2, v3 = apply_preset(cfgs[m.V2]), apply_preset(cfgs[m.V3])
    assert v2.queue.ordering == "fcfs" and v3.queue.ordering == "sjf_aging"
    assert v3.queue.sjf_prompt_weight == pytest.approx(w) and v3.queue.short_boost == 3.0
    assert m.fewest(lambda n: n >= 5, 2, 9) == 5
    assert m.fewest(lambda n: False, 2, 9) is None
    assert m.near(lambda n: n >= 5, 8, 2, 9) == 5 and m.near(lambda n: n >= 7, 4, 2, 9) == 7
    assert m.near(lambda n: False, 4, 2, 9) is None
    small = m.build_workload(conv, seed=2, scale=0.005)
    st = m.Study(small, profile, 20.0, 1000.0, w)
    r3 = st.run(m.V3, 1)
    assert st.run(m.V3, 1) is r3  # cached
    assert set(r3.p99) == set(m.TIERS) and 0.0 < r3.busy <= 1.0
    assert r3.p99["tier-1"] < m.SLA_S  # a light load: tier-1 well inside its SLA


def test_n_engine_priority_helpers() -> None:
    prof = engine_profile()
    fast = n.at_speed(prof, 3.0)
    assert fast.step_time(100, 8, 4000) == pytest.approx(prof.step_time(100, 8, 4000) / 3)
    alone = n.engines_only(True)
    assert alone.pools[0].engine_priority and not alone.saturation.enabled
    assert all(t.limits is None for t in alone.tenants)
    gw = n.gateway()
    assert not gw.pools[0].engine_priority and gw.pools[0].max_in_flight == 96
    levers = n.gateway(engine_priority=True, adaptive=True, shed_x=2.0)
    assert levers.pools[0].engine_priority and levers.pools[0].max_in_flight is None
    std = {t.name: t for t in levers.tiers}["standard"]
    before = {t.name: t for t in gw.tiers}["standard"].max_wait_s
    assert before is not None and std.max_wait_s == pytest.approx(2 * before)
    assert levers.pools[0].adaptive.initial == pytest.approx(48.0)  # the example's 96 / 2
    sc = n.conv_scenario(window_s=2.0, load=1.5)
    assert sc.requests and sc.requests[-1].t < 2.0 and sc.bound_s == 2.0 + n.DRAIN_S
    cases = {c.key: c for c in n.CASES}
    ep = n.run_case(sc, cases["eprio"])
    g = n.run_case(sc, cases["gw"])
    assert set(ep.tiers) == set(n.TIERS)
    assert sum(x.offered for x in ep.tiers.values()) == len(sc.requests)
    assert g.wasted_tokens >= 0 and ep.in_slo <= len(sc.requests)


def _report(text: str) -> Report:
    rep = Report("(z) A study", f"**Verdict: Reproduced.** {text}")
    rep.h2("Setup")
    rep.para("p | q")
    return rep


def test_the_stamp_changes_only_with_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "z_study"
    out.mkdir()
    monkeypatch.setattr(common, "_commit", lambda where: "aaa1111")
    path = _report("x 1.0 s").write(out)
    first = path.read_text(encoding="utf-8")
    stamp = "Generated by `.venv/bin/python -m experiments.z_study.run` at commit aaa1111."
    assert first.split("\n")[:4] == ["# (z) A study", "", stamp, ""]
    assert split_stamp(first) == (stamp, _report("x 1.0 s").render())
    monkeypatch.setattr(common, "_commit", lambda where: "bbb2222")
    _report("x 1.0 s").write(out)  # same body: the committed stamp stays
    assert path.read_text(encoding="utf-8") == first
    _report("x 1.1 s").write(out)  # new body: a new stamp
    assert "at commit bbb2222." in path.read_text(encoding="utf-8")


def test_a_changed_plot_restamps_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "z_study"
    out.mkdir()

    def plot(y: float) -> Figure:
        fig = Figure(figsize=(2, 2))
        fig.subplots().plot([0.0, 1.0], [0.0, y])
        return fig

    monkeypatch.setattr(common, "_commit", lambda where: "aaa1111")
    path = _report("x").write(out)
    save_plot(plot(1.0), out / "p.png")
    assert "aaa1111" in path.read_text(encoding="utf-8")
    monkeypatch.setattr(common, "_commit", lambda where: "bbb2222")
    common._CHANGED_PLOTS.clear()  # a new run: the same plot, then the same report
    save_plot(plot(1.0), out / "p.png")
    _report("x").write(out)
    assert "aaa1111" in path.read_text(encoding="utf-8")
    save_plot(plot(2.0), out / "p.png")  # after its report was written
    assert "bbb2222" in path.read_text(encoding="utf-8")
    common._CHANGED_PLOTS.clear()
    monkeypatch.setattr(common, "_commit", lambda where: "ccc3333")
    save_plot(plot(3.0), out / "p.png")  # before its report is written
    _report("x").write(out)
    assert "ccc3333" in path.read_text(encoding="utf-8")


def test_the_commit_is_dirty_only_outside_the_outputs() -> None:
    assert common._is_output("experiments/h_saturation/REPORT.md")
    assert common._is_output("experiments/README.md")
    assert not common._is_output("experiments/h_saturation/run.py")
    assert not common._is_output("velvetrope/sim/engine.py")


def test_the_verdict_table_is_generated_from_the_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "_commit", lambda where: "aaa1111")
    for name, verdict in (
        ("a_first_one", "**Verdict: Not reproduced** for a batched fleet; 3.3% | 11.4%."),
        ("b_second", "**Verdict.** No label here."),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.py").write_text("", encoding="utf-8")
        Report("t", verdict).write(tmp_path / name)
    (tmp_path / "c_not_run").mkdir()
    (tmp_path / "c_not_run" / "run.py").write_text("", encoding="utf-8")
    (tmp_path / "helpers").mkdir()  # not a study: no run.py
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n\n{index.BEGIN}\nold\n{index.END}\n\noutro\n", encoding="utf-8")
    assert index.update_readme(tmp_path)
    assert readme.read_text(encoding="utf-8") == (
        f"intro\n\n{index.BEGIN}\n"
        "| study | verdict | the report's verdict |\n"
        "| --- | --- | --- |\n"
        "| [(a) first one](a_first_one/REPORT.md) | **Not reproduced** | for a batched fleet; "
        "3.3% \\| 11.4%. |\n"
        "| [(b) second](b_second/REPORT.md) | – | No label here. |\n"
        "| [(c) not run](c_not_run/REPORT.md) | – | not run yet |\n"
        f"{index.END}\n\noutro\n"
    )
    assert not index.update_readme(tmp_path)  # nothing changed: nothing written
    readme.write_text("no markers\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        index.update_readme(tmp_path)


def test_the_committed_table_matches_the_reports() -> None:
    readme = index.EXPERIMENTS / "README.md"
    text = readme.read_text(encoding="utf-8")
    rows = [index.row_of(d) for d in index.studies()]
    assert f"{index.BEGIN}\n{index.render_table(rows)}\n{index.END}" in text
