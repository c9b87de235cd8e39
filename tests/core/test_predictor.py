"""The length predictor: exact quantiles on fixed data, bounded memory under a stream of
unique templates, fallbacks, what it conditions on, and the client's own expected length."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tests.core.helpers import controller, make_job
from velvetrope.core import Job, Usage
from velvetrope.core.estimate import QuantileEstimator
from velvetrope.core.predictor import LengthPredictor, RingQuantile


def job(
    tenant: str = "t",
    template: str | None = "tpl",
    prompt: int = 100,
    max_tokens: int = 4096,
    model: str | None = "m",
) -> Job:
    return Job("j", tenant, "default", prompt, max_tokens, model=model, template=template)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("window", [1, 7, 64])
def test_ring_quantile_is_numpys_inverted_cdf_of_the_window(p: float, window: int) -> None:
    rng = np.random.default_rng(int(p * 100) + window)
    xs = rng.integers(1, 2000, size=300).tolist()
    rq = RingQuantile(p, window, refresh=1)
    assert np.isnan(rq.value())
    for i, x in enumerate(xs):
        rq.add(x)
        ref = np.quantile(xs[max(0, i + 1 - window) : i + 1], p, method="inverted_cdf")
        assert rq.value() == int(ref)


def test_the_predictor_predicts_the_reference_quantile_of_its_group() -> None:
    rng = np.random.default_rng(5)
    xs = rng.lognormal(5, 1, size=500).astype(int) + 1
    pred = LengthPredictor(0.9, window=64, min_observations=8, refresh=1)
    j = job()
    for i, x in enumerate(xs.tolist()):
        pred.observe(j, x)
        if i + 1 >= 8:
            ref = np.quantile(xs[max(0, i + 1 - 64) : i + 1], 0.9, method="inverted_cdf")
            assert pred.predict(j) == min(4096, int(ref))
    assert pred.predict(job(max_tokens=10)) == 10  # capped by max_tokens


def test_memory_is_bounded_under_a_stream_of_unique_templates() -> None:
    pred = LengthPredictor(window=64, max_keys=500)
    tracemalloc.start()
    try:
        sizes = []
        for i in range(30_000):
            j = job(tenant=f"t{i % 50}", template=f"tpl-{i}", prompt=1 + i % 3000)
            pred.predict(j)
            pred.observe(j, 1 + i % 700)
            if i in (15_000, 29_999):
                sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert len(pred) <= 500
    assert sizes[1] < 1.05 * sizes[0]  # twice the stream, no more memory (rings are full)
    assert sizes[1] < 3_000_000


def test_a_cold_start_falls_back_to_coarser_levels() -> None:
    pred = LengthPredictor(0.5, default=77, min_observations=5, refresh=1)
    assert pred.predict(job()) == 77
    assert pred.level(job()) == "default"
    for _ in range(5):
        pred.observe(job(tenant="a", template="x"), 10)
    assert pred.predict(job(tenant="a", template="x")) == 10
    assert pred.level(job(tenant="a", template="x")) == "tp"
    # a new template of the same tenant: the tenant's model/max_tokens level
    assert pred.level(job(tenant="a", template="new")) == "mp"
    assert pred.predict(job(tenant="a", template="new", prompt=100)) == 10
    # another prompt length and no template: the tenant's model and max_tokens
    assert pred.level(job(tenant="a", template=None, prompt=5000)) == "m"
    # another model: the tenant alone; another tenant: everyone
    assert pred.level(job(tenant="a", model="other", prompt=5000)) == "n"
    assert pred.level(job(tenant="b")) == "*"
    assert pred.predict(job(tenant="b")) == 10


def test_it_tells_templates_and_prompt_lengths_apart() -> None:
    pred = LengthPredictor(0.5, min_observations=5, refresh=1)
    est = QuantileEstimator(0.5, min_observations=5)
    for i in range(200):
        short, long_ = job(template="classify"), job(template="essay")
        pred.observe(short, 5)
        est.observe(short, 5)
        pred.observe(long_, 800)
        est.observe(long_, 800)
        # summaries: output a tenth of the prompt
        p = 2 ** (6 + i % 6)
        pred.observe(job(template="summarise", prompt=p), p // 10)
    assert pred.predict(job(template="classify")) == 5
    assert pred.predict(job(template="essay")) == 800
    assert est.predict(job(template="classify")) == est.predict(job(template="essay"))
    small = pred.predict(job(template="summarise", prompt=100))
    large = pred.predict(job(template="summarise", prompt=1500))
    assert (small, large) == (6, 102)
    off = LengthPredictor(0.5, min_observations=5, refresh=1, prompt_feature=False)
    for i in range(120):
        p = 2 ** (6 + i % 6)
        off.observe(job(template="summarise", prompt=p), p // 10)
    assert off.predict(job(template="summarise", prompt=100)) == off.predict(
        job(template="summarise", prompt=1500)
    )


def test_the_controller_predicts_with_the_configured_estimator() -> None:
    ctl, _ = controller({"pools": [{"name": "default", "max_in_flight": 4}]})
    assert isinstance(ctl.estimator, LengthPredictor)
    ctl2, _ = controller({"estimator": {"kind": "tenant"}})
    assert isinstance(ctl2.estimator, QuantileEstimator)
    ctl3, _ = controller({"estimator": {"window": 16, "max_keys": 32, "prompt_feature": False}})
    assert isinstance(ctl3.estimator, LengthPredictor)
    assert ctl3.estimator.max_keys == 32
    assert not ctl3.estimator.prompt_feature
    # outputs of completed jobs train it
    for _ in range(10):
        j = make_job(prompt=100, max_tokens=1000, template="a")
        ctl.arrive(j)
        ctl.first_token(j.id)
        ctl.complete(j.id, Usage(100, 42))
    j = make_job(prompt=100, max_tokens=1000, template="a")
    ctl.arrive(j)
    assert j.predicted_output == 42


def test_an_expected_length_is_taken_only_from_tenants_trusted_with_it() -> None:
    cfg = {
        "tenants": [
            {"name": "trusted", "tier": "default", "trust_expected_output": True},
            {"name": "other", "tier": "default"},
        ],
        "estimator": {"default_output_tokens": 300},
        "pools": [{"name": "default", "max_in_flight": 100}],
    }
    ctl, _ = controller(cfg)
    a = make_job(tenant="trusted", max_tokens=1000, expected_output=20)
    b = make_job(tenant="other", max_tokens=1000, expected_output=20)
    c = make_job(tenant="trusted", max_tokens=50, expected_output=20_000)
    for j in (a, b, c):
        ctl.arrive(j)
    assert a.predicted_output == 20
    assert b.predicted_output == 300  # ignored: the estimate
    assert c.predicted_output == 50  # capped by max_tokens
    assert a.cost == 100 + 20  # reserved as predicted


def test_recency_kept_by_ticks_drops_the_same_groups_as_an_ordered_dict() -> None:
    """Far from ``max_keys`` the predictor keeps recency as ticks and orders its groups only
    when they may start to be dropped: it predicts and drops exactly as one that keeps them
    in recency order from the start."""
    rng = np.random.default_rng(11)
    lazy = LengthPredictor(0.5, min_observations=2, window=8, max_keys=60, refresh=1)
    eager = LengthPredictor(0.5, min_observations=2, window=8, max_keys=60, refresh=1)
    eager._order()  # recency order from the first group on
    for i in range(3000):
        tpl = None if i % 5 == 0 else f"tpl-{int(rng.integers(0, 4 + i // 100))}"
        j = job(tenant=f"t{i % 3}", template=tpl, prompt=int(rng.integers(1, 5000)))
        assert lazy.predict(j) == eager.predict(j)
        assert lazy.level(j) == eager.level(j)
        out = int(rng.integers(1, 900))
        lazy.observe(j, out)
        eager.observe(j, out)
        if i in (50, 500, 2999):
            assert list(lazy._groups) == list(eager._groups)
    assert len(lazy) == 60
