"""Budgets in what-if runs (velvetrope.sim.quotas): the core's quota rule on a workload in
virtual time, the forecast, and ``velvetrope simulate`` / ``plan`` with a config's quotas."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.core.quota_config import QuotaSettings
from velvetrope.sim.quotas import apply_quotas, forecast, refusing
from velvetrope.sim.trace_request import TraceRequest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"
START = datetime(2026, 12, 7, 22, 0, tzinfo=UTC).timestamp()  # 23:00 in Paris
DOWN = {"on_exceeded": "downgrade", "downgrade_to_tier": "batch"}


def workload(n: int, every_s: float, tenant: str = "acme") -> list[TraceRequest]:
    """``n`` requests of 100 prompt + 100 output tokens, one every ``every_s``."""
    return [TraceRequest(t=i * every_s, tenant=tenant, prompt_tokens=100, output_tokens=100)
            for i in range(n)]  # fmt: skip


def quotas(**budget: Any) -> QuotaSettings:
    b = {"tenant": "acme", "window": "day", "tokens": 1000, **budget}
    return QuotaSettings.model_validate({"time_zone": "Europe/Paris", "budgets": [b]})


def test_a_spent_daily_budget_downgrades_until_the_next_day_then_the_day_is_full() -> None:
    # one request a minute from 23:00 Paris: 5 fit in 1000 tokens, the rest of the hour is
    # downgraded, and from midnight the next day's budget takes 5 again
    kept, run = apply_quotas(workload(90, 60.0), quotas(**DOWN), START)
    assert len(kept) == 90 and sum(run.refused.values()) == 0
    assert run.forced_tiers == [None] * 5 + ["batch"] * 55 + [None] * 5 + ["batch"] * 25
    assert run.downgraded == {("acme", "batch"): 80}
    assert run.first_denied == {
        "quota:acme:day:2026-12-07:tok": 5 * 60.0,
        "quota:acme:day:2026-12-08:tok": 65 * 60.0,
    }
    # the same budget refusing: the same requests are dropped instead
    kept, run = apply_quotas(workload(90, 60.0), refusing(quotas(**DOWN)), START)
    assert len(kept) == 10 and run.refused == {"acme": 80}
    assert run.forced_tiers == [None] * 10


def test_a_rolling_budget_refills_over_its_hours() -> None:
    # 1000 tokens over 1 h, 200 every 50 s: five at once (55.6 left at 200 s, refilled at
    # 1000/3600 a second), then one each time the level is back over 200
    kept, run = apply_quotas(workload(30, 50.0), quotas(window="rolling", hours=1), START)
    assert [r.t for r in kept] == [0.0, 50.0, 100.0, 150.0, 200.0, 750.0, 1450.0]
    assert run.refused == {"acme": 23}


def test_the_forecast_says_when_each_budget_is_spent_at_the_workloads_pace() -> None:
    # 200 tokens a minute: 1000 are spent in 5 minutes, from 23:00 Paris
    rows = forecast(workload(10, 60.0), quotas(), START, span_s=600.0)
    (f,) = rows
    assert f.use_per_day == 200 * 60 * 24
    assert f.exhausted_at == START + 300.0
    # a month of 1e7 tokens at 288,000 a day: never spent (December has 24 days and 1 h left)
    month = quotas(window="month", tokens=1.0e7)
    (f,) = forecast(workload(10, 60.0), month, START, span_s=600.0)
    assert f.exhausted_at is None  # 24 days x 288,000 < 1e7, and a full month uses 89%
    assert round(f.share, 2) == round(288_000 * 31 / 1e7, 2)
    # cost: $ per 1M tokens from the price table
    usd = QuotaSettings.model_validate(
        {"prices": {"*": {"input": 1.0, "output": 3.0}},
         "budgets": [{"tenant": "*", "window": "day", "cost_usd": 1.0}]}
    )  # fmt: skip
    (f,) = forecast(workload(10, 60.0), usd, START, span_s=600.0)
    assert f.use_per_day == pytest.approx(1440 * (100 * 1.0 + 100 * 3.0) / 1e6)
    # a rolling budget whose refill outpaces the use is never spent
    (f,) = forecast(workload(10, 60.0), quotas(window="rolling", hours=1, tokens=1.0e6),
                    START, span_s=600.0)  # fmt: skip
    assert f.exhausted_at is None


def test_simulate_and_plan_take_the_configs_quotas(tmp_path: Path) -> None:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["quotas"] = {
        "time_zone": "Europe/Paris",
        "budgets": [{"tenant": "acme", "window": "day", "tokens": 20_000, **DOWN},
                    {"tenant": "globex", "window": "day", "tokens": 20_000}],
    }  # fmt: skip
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump(cfg))
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        json.dumps({"t": i * 0.5, "tenant": ("acme", "globex")[i % 2], "prompt_tokens": 100,
                    "output_tokens": 100}) + "\n"
        for i in range(400)
    ))  # fmt: skip
    out = tmp_path / "rep"
    runner = CliRunner()
    args = ["simulate", "--config", str(config), "--trace", str(trace), "--replicas", "1",
            "--start", "2026-12-07T08:00", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = result.output
    # 100 requests of 200 tokens each fit a day's 20,000; the other 100 of each tenant not
    assert "budgets in the run: 400 offered, 100 refused (quota_exceeded), 100 downgraded" in text
    assert "downgraded acme -> batch: 100" in text and "refused globex: 100" in text
    assert "downgrade (this run): top tier interactive: 100/100 done" in text
    assert "refuse (200 refused): top tier interactive: 100/100 done" in text
    # the forecast: 200 tokens per second of each tenant's (400 tokens/s over 200 s in all)
    rows = [line.split() for line in text.splitlines()]
    assert ["acme", "day", "20000", "tok", "1.728e+07", "86400%", "2026-12-07", "09:01"] in rows
    assert "## Budgets" in (out / "report.md").read_text()

    plan = runner.invoke(app, ["plan", "--trace", str(trace), "--config", str(config),
                               "--start", "2026-12-07T08:00", "--peak-rps", "1"])  # fmt: skip
    assert plan.exit_code == 0, plan.output
    # at 1 req/s, each tenant's 0.5 req/s x 200 tokens: 20,000 tokens last 200 s
    rows = [line.split() for line in plan.output.splitlines()]
    assert ["globex", "day", "20000", "tok", "8.64e+06", "43200%", "2026-12-07", "09:03"] in rows
