"""What the gateway knows about output lengths: the oracle, the core's estimator, or a noisy
predictor of chosen rank quality.

Three kinds of knowledge (:class:`LengthKnowledge`, parsed from ``oracle``, ``estimator``,
``noisy:TAU``):

``oracle``
    every job's ``predicted_output`` is its true output length (clamped to
    ``[1, max_tokens]``): the upper bound of what SJF can gain.
``estimator``
    ``predicted_output`` is left ``None``, so the admission core's own estimator (a
    per-tenant running quantile, :class:`~velvetrope.core.estimate.QuantileEstimator`, or
    the one passed to the simulator) predicts it: what a deployment has without a model.
``noisy:TAU``
    a learned predictor whose predictions have Kendall rank correlation ``TAU`` with the
    truth (``-1 <= TAU <= 1``), built by a Gaussian copula (:func:`copula_predictions`):
    predictions keep the truth's marginal distribution, only their ranking is noisy.
    ``noisy:1`` is the oracle, ``noisy:0`` a predictor that knows nothing of the job.

The copula: truth values are ranked (ties broken at random), mapped to normal scores
``z = Φ⁻¹((rank + ½)/n)``; the prediction's score is ``z' = r·z + √(1 − r²)·ε`` with
``ε ~ N(0, 1)`` and ``r = sin(π·τ/2)`` (Greiner's relation: a bivariate normal with Pearson
``r`` has Kendall ``τ = (2/π)·arcsin r``), and the prediction is the truth's empirical
quantile at ``Φ(z')``.  Kendall's τ is invariant under the monotone maps on both sides, so
the predictions rank-correlate with the truth at ``τ`` up to sampling error and up to ties in
the truth (tied true values are ordered at random, which the copula cannot know about; the
tie-corrected τ-b of very discrete data is slightly below the target).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtr, ndtri

from velvetrope.errors import PolicyError
from velvetrope.sim.seeds import Seed, as_generator

__all__ = ["LengthKnowledge", "copula_predictions", "parse_lengths", "predicted_outputs"]

IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class LengthKnowledge:
    """One of ``oracle``, ``estimator`` or ``noisy`` (with ``tau``); see the module docstring.

    Construction validates: ``tau`` is given exactly for ``noisy`` and lies in ``[-1, 1]``.
    ``str()`` gives back the form :func:`parse_lengths` reads.
    """

    kind: Literal["oracle", "estimator", "noisy"]
    tau: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("oracle", "estimator", "noisy"):
            raise PolicyError(f"unknown length knowledge {self.kind!r}")
        if self.kind == "noisy":
            if self.tau is None or not (math.isfinite(self.tau) and -1.0 <= self.tau <= 1.0):
                raise PolicyError(f"noisy lengths need a Kendall tau in [-1, 1], got {self.tau!r}")
        elif self.tau is not None:
            raise PolicyError(f"{self.kind!r} lengths take no tau")

    def __str__(self) -> str:
        return f"noisy:{self.tau:g}" if self.kind == "noisy" else self.kind


def parse_lengths(text: str | LengthKnowledge) -> LengthKnowledge:
    """Parse ``oracle``, ``estimator`` or ``noisy:TAU`` (also ``noisy:tau=TAU``)."""
    if isinstance(text, LengthKnowledge):
        return text
    s = text.strip().lower()
    if s in ("oracle", "estimator"):
        return LengthKnowledge(s)  # type: ignore[arg-type]
    kind, sep, arg = s.partition(":")
    if kind == "noisy" and sep:
        arg = arg.removeprefix("tau=")
        try:
            tau = float(arg)
        except ValueError:
            raise PolicyError(f"bad Kendall tau {arg!r} in {text!r}") from None
        return LengthKnowledge("noisy", tau)
    raise PolicyError(f"unknown length knowledge {text!r}; expected oracle, estimator or noisy:TAU")


def copula_predictions(truth: Sequence[int] | IntArray, tau: float, seed: Seed) -> IntArray:
    """Predictions with Kendall rank correlation ``tau`` to ``truth`` and the same marginal.

    ``truth`` is a 1-D array of integers; the result has the same length and takes only
    values that occur in ``truth``.  The same seed gives the same predictions.
    """
    if not (math.isfinite(tau) and -1.0 <= tau <= 1.0):
        raise PolicyError(f"Kendall tau must be in [-1, 1], got {tau!r}")
    x = np.asarray(truth, dtype=np.int64)
    if x.ndim != 1:
        raise PolicyError("truth must be a one-dimensional sequence")
    n = int(x.size)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    rng = as_generator(seed)
    order = np.lexsort((rng.random(n), x))  # by value, ties at random
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.arange(n, dtype=np.float64)
    z = ndtri((ranks + 0.5) / n)
    r = math.sin(math.pi * tau / 2.0)
    z_pred = r * z + math.sqrt(max(0.0, 1.0 - r * r)) * rng.standard_normal(n)
    idx = np.minimum((ndtr(z_pred) * n).astype(np.int64), n - 1)
    pred: IntArray = np.sort(x)[idx]
    return pred


def predicted_outputs(
    knowledge: LengthKnowledge,
    outputs: Sequence[int] | IntArray,
    max_tokens: Sequence[int] | IntArray,
    seed: Seed,
) -> list[int | None]:
    """Per request, the ``predicted_output`` to put on its job (``None``: the core estimates).

    ``outputs`` are the true output lengths, ``max_tokens`` the declared limits (``>= 1``);
    predictions are clamped to ``[1, max_tokens]``, as the core's own estimates are.
    """
    n = len(outputs)
    if len(max_tokens) != n:
        raise PolicyError("outputs and max_tokens must have the same length")
    if knowledge.kind == "estimator":
        return [None] * n
    truth = np.asarray(outputs, dtype=np.int64)
    if knowledge.kind == "noisy":
        assert knowledge.tau is not None
        truth = copula_predictions(truth, knowledge.tau, seed)
    caps = np.asarray(max_tokens, dtype=np.int64)
    pred: list[int | None] = np.clip(truth, 1, caps).tolist()
    return pred
