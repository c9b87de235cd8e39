"""Edge bucket sizes in force: a minute of refill by default, the seed's 4 s on request."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from tests.core.helpers import arrive
from velvetrope.cli import app
from velvetrope.core import PolicyConfig, Reason, Rejected
from velvetrope.core.bucket_limits import DEFAULT_BURST_S, BucketLimits
from velvetrope.core.policy import bucket_report

from .helpers import controller, make_job

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


def limited(limits: dict[str, float]) -> dict[str, object]:
    return {
        "tenants": [{"name": "t", "tier": "default", "limits": limits}],
        "pools": [{"name": "default", "max_in_flight": 100}],
        "estimator": {"reserve": "max_tokens"},
    }


def test_capacity_in_force() -> None:
    assert DEFAULT_BURST_S == 60.0
    assert BucketLimits(tokens_per_minute=6000).token_capacity == 6000
    assert BucketLimits(tokens_per_minute=6000, token_burst=400).token_capacity == 400
    assert BucketLimits(requests_per_minute=30).request_capacity == 30
    assert BucketLimits(requests_per_minute=30, request_burst=2).request_capacity == 2
    assert BucketLimits().token_capacity is None and BucketLimits().request_capacity is None


def test_a_minute_of_tokens_is_admitted_at_once_by_default() -> None:
    ctl, _ = controller(limited({"tokens_per_minute": 6000}))
    for _ in range(6):  # 6 × (100 + 900) = the whole minute
        assert not isinstance(arrive(ctl, make_job(prompt=100, max_tokens=900)), Rejected)
    d = arrive(ctl, make_job(prompt=100, max_tokens=900))
    assert isinstance(d, Rejected) and d.reason is Reason.RATE_LIMITED


def test_the_seeds_four_seconds_can_be_smaller_than_one_request() -> None:
    # 6000 tokens/min with the seed's 4 s of refill holds 400 tokens: a 1000-token request
    # can never be admitted, however long the client waits.
    ctl, _ = controller(limited({"tokens_per_minute": 6000, "token_burst": 400}))
    d = arrive(ctl, make_job(prompt=100, max_tokens=900))
    assert isinstance(d, Rejected) and d.reason is Reason.REQUEST_TOO_LARGE


def test_bucket_report_says_where_each_capacity_comes_from() -> None:
    cfg = PolicyConfig.model_validate(
        {
            "tiers": [
                {"name": "gold", "limits": {"tokens_per_minute": 60_000, "token_burst": 4000}}
            ],
            "tenants": [
                {"name": "a", "tier": "gold", "limits": {"tokens_per_minute": 6000}},
                {"name": "b", "tier": "gold", "limits": {"requests_per_minute": 6}},
            ],
            "models": {"m": {"tokens_per_minute": 1200}},
        }
    )
    lines = bucket_report(cfg)
    assert len(lines) == 3  # b has no token bucket
    a, gold, m = lines
    assert a.startswith("bucket tenant 'a': 6,000 tokens/min, capacity 6,000 — token_burst unset")
    assert "the common rule of thumb is 4 s = 400 tokens" in a
    assert "seed" not in a  # a word that means nothing to a user
    assert gold.startswith(
        "bucket tier 'gold': 60,000 tokens/min, capacity 4,000 — token_burst, 4 s"
    )
    assert "capacity 1,200" in m


def test_config_check_prints_the_buckets() -> None:
    res = CliRunner().invoke(app, ["config", "check", str(EXAMPLE)])
    assert res.exit_code == 0, res.output
    assert "bucket tenant 'acme': 3,000,000 tokens/min, capacity 3,000,000" in res.stdout
    assert "60 s of refill" in res.stdout and "4 s = 200,000 tokens" in res.stdout


def test_held_claims_take_the_jobs_cost_from_token_buckets_and_1_from_request_buckets() -> None:
    """ClaimSpecs.claims_for: a claim per bucket of the job's tenant, tier and model, its cost from
    each token bucket and 1 from each request bucket; none for a tenant without limits."""
    from velvetrope.core.claims import ClaimSpecs

    config = PolicyConfig.model_validate(
        {
            "tiers": [{"name": "gold", "limits": {"requests_per_minute": 60}}, {"name": "free"}],
            "tenants": [
                {"name": "a", "tier": "free", "limits": {"tokens_per_minute": 6000}},
                {"name": "b", "tier": "gold", "limits": {"tokens_per_minute": 600}},
            ],
            "models": {"m": {"tokens_per_minute": 1e6}},
        }
    )
    limits = {t.name: t.limits for t in config.tenants}
    specs = ClaimSpecs(config, lambda t: limits.get(t))
    cases: list[tuple[str, str, str | None, list[tuple[str, float]]]] = [
        ("a", "free", None, [("tenant:a:tok", 140.0)]),
        (
            "b",
            "gold",
            "m",
            [("tenant:b:tok", 140.0), ("tier:gold:req", 1.0), ("model:m:tok", 140.0)],
        ),
        ("c", "free", None, []),
    ]
    for tenant, tier, model, want in cases:
        job = make_job(tenant, tier, prompt=40, model=model)
        for _ in range(2):  # built, then from the cache
            held = specs.claims_for(job, tenant, tier, model, 140)
            assert isinstance(held, tuple)
            assert [(c.key, c.amount) for c in held] == want
