"""Length knowledge: parsing, the oracle, and the Gaussian-copula predictor's Kendall tau."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau

from velvetrope.errors import PolicyError
from velvetrope.sim.lengths import (
    LengthKnowledge,
    copula_predictions,
    parse_lengths,
    predicted_outputs,
)


@pytest.mark.parametrize("tau", [-0.5, 0.0, 0.3, 0.6, 0.9])
def test_copula_predictions_have_the_requested_kendall_tau(tau: float) -> None:
    rng = np.random.default_rng(11)
    truth = np.round(rng.lognormal(5.0, 1.0, 6000) * 50).astype(np.int64)  # few ties
    pred = copula_predictions(truth, tau, seed=3)
    measured = kendalltau(truth, pred).statistic
    assert measured == pytest.approx(tau, abs=0.03)


def test_copula_keeps_the_marginal_and_tau_one_is_the_oracle() -> None:
    rng = np.random.default_rng(2)
    truth = rng.integers(1, 500, 3000)
    pred = copula_predictions(truth, 0.4, seed=1)
    assert set(pred.tolist()) <= set(truth.tolist())
    qs = [10, 50, 90]
    assert np.percentile(pred, qs) == pytest.approx(np.percentile(truth, qs), rel=0.1)
    np.testing.assert_array_equal(copula_predictions(truth, 1.0, seed=5), truth)


def test_copula_is_deterministic_per_seed() -> None:
    truth = np.arange(1, 200)
    a = copula_predictions(truth, 0.5, seed=1)
    np.testing.assert_array_equal(a, copula_predictions(truth, 0.5, seed=1))
    assert not np.array_equal(a, copula_predictions(truth, 0.5, seed=2))


def test_predicted_outputs_by_kind() -> None:
    outs, caps = [5, 300, 40], [10, 256, 64]
    assert predicted_outputs(parse_lengths("oracle"), outs, caps, 0) == [5, 256, 40]
    assert predicted_outputs(parse_lengths("estimator"), outs, caps, 0) == [None] * 3
    noisy = predicted_outputs(parse_lengths("noisy:0.2"), outs, caps, 0)
    assert all(p is not None and 1 <= p <= c for p, c in zip(noisy, caps, strict=True))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("oracle", LengthKnowledge("oracle")),
        ("Estimator", LengthKnowledge("estimator")),
        ("noisy:0.7", LengthKnowledge("noisy", 0.7)),
        ("noisy:tau=-0.2", LengthKnowledge("noisy", -0.2)),
    ],
)
def test_parse_lengths(text: str, expected: LengthKnowledge) -> None:
    got = parse_lengths(text)
    assert got == expected
    assert parse_lengths(str(got)) == got


@pytest.mark.parametrize("text", ["noisy", "noisy:1.5", "noisy:x", "magic", "oracle:1"])
def test_parse_lengths_rejects_bad_input(text: str) -> None:
    with pytest.raises(PolicyError):
        parse_lengths(text)
