"""Reports: deterministic bytes, content, plots, sweeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from velvetrope.core import PolicyConfig
from velvetrope.core.policy import SloPolicy
from velvetrope.engine import load_profile
from velvetrope.errors import PolicyError
from velvetrope.sim.inputs import default_policy, prepare_workload
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.report import tier_table, write_report
from velvetrope.sim.sweep import parse_sweep, run_sweep
from velvetrope.sim.tenant_mix import TenantMix

MIX = TenantMix.parse("gold:interactive:0.3,silver:standard:0.3,bronze:batch:0.4")
PROFILE = load_profile("llama3-8b-h100")


def small_run(seed: int, out: Path) -> bytes:
    work = prepare_workload("azure_conv", tenants=MIX, seed=seed, limit=400)
    policy = default_policy(MIX, 2)
    res = run_simulation(
        policy,
        work,
        2,
        PROFILE,
        load=1.2,
        lengths="noisy:0.6",
        client_timeout_s=20.0,
        slos={"batch": SloPolicy(ttft_s=30.0)},
        seed=seed,
        label="azure_conv[:400]",
    )
    path = write_report(res, out)
    return path.read_bytes()


def test_same_seed_gives_byte_identical_reports(tmp_path: Path) -> None:
    a = small_run(1, tmp_path / "a")
    b = small_run(1, tmp_path / "b")
    c = small_run(2, tmp_path / "c")
    assert a == b
    assert a != c
    for png in ("ttft_cdf.png", "queue.png"):
        assert (tmp_path / "a" / png).read_bytes() == (tmp_path / "b" / png).read_bytes()
        assert (tmp_path / "a" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_content(tmp_path: Path) -> None:
    text = small_run(3, tmp_path).decode()
    for needle in (
        "# velvetrope simulation report",
        "| interactive | TTFT ≤ 2 s, TPOT ≤ 0.1 s |",
        "| batch | TTFT ≤ 30 s |",
        "1.2 × capacity",
        "noisy:0.6",
        "client timeout | 20 s",
        "## Requests not completed, by reason",
        "GPU busy",
        "**Goodput**",
        "![TTFT distribution by tier](ttft_cdf.png)",
    ):
        assert needle in text
    assert "wall" not in text.lower()


def test_table_renders() -> None:
    work = prepare_workload("azure_conv", tenants=MIX, seed=0, limit=100)
    res = run_simulation(default_policy(MIX, 1), work, 1, PROFILE)
    console = Console(width=200, record=True)
    console.print(tier_table(res))
    out = console.export_text()
    assert "interactive" in out and "all" in out and "GPU busy" in out


def test_sweep_report_has_a_row_per_point_and_a_curve(tmp_path: Path) -> None:
    work = prepare_workload("azure_conv", tenants=MIX, seed=0, limit=250)
    sweep = parse_sweep(["policy=fifo,priority", "load=0.5,1.5"])
    res = run_sweep(
        default_policy(MIX, 2), work, PROFILE, sweep, base={"replicas": 2}, progress=False
    )
    assert [p for p, _ in res.points] == [
        {"policy": "fifo", "load": "0.5"},
        {"policy": "fifo", "load": "1.5"},
        {"policy": "priority", "load": "0.5"},
        {"policy": "priority", "load": "1.5"},
    ]
    # strict priority protects the top tier under overload; FIFO does not
    fifo_hi = res.points[1][1].summary()[0]
    prio_hi = res.points[3][1].summary()[0]
    assert prio_hi.tier == "interactive"
    assert prio_hi.ttft[2] < fifo_hi.ttft[2]
    path = res.write_report(tmp_path)
    text = path.read_text()
    assert text.count("\n| fifo |") == 2 and text.count("\n| priority |") == 2
    assert (tmp_path / "latency_vs_load.png").stat().st_size > 0


@pytest.mark.parametrize("bad", ["policy", "colour=red", "policy=nope", "load=x", "load=-1"])
def test_parse_sweep_rejects_bad_items(bad: str) -> None:
    with pytest.raises(PolicyError):
        parse_sweep([bad])
    with pytest.raises(PolicyError):
        parse_sweep(["load=1", "load=2"])


def test_default_policy_from_mix() -> None:
    p = default_policy(TenantMix.parse("a:hi:1,b:lo:1,c:1"), 3)
    assert [t.name for t in p.tiers] == ["hi", "lo"]
    assert {(t.name, t.tier) for t in p.tenants} == {("a", "hi"), ("b", "lo")}
    assert p.pools[0].max_in_flight == 192
    assert default_policy(None, 1).tiers[0].name == "default"
    assert isinstance(p, PolicyConfig)
