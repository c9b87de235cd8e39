"""Held-out folds that borrow an unidentified coefficient from another profile's fit.

When a source is held out (:mod:`velvetrope.engine.holdout`), the remaining sources of a
profile may carry no row dominated by one of its coefficients: the fit then trades that
coefficient against the others and leaves it near where it started (a datasheet guess), and
the held-out rows that depend on it are predicted by the guess.  A :class:`Borrow`
replaces the guess by physics: the same coefficient of a *donor* profile (another model on
the same kind of GPU), fitted **in the same fold** (the same source held out, so nothing of
it reaches either fit), times a fixed scale; the fold's fit then keeps that coefficient
fixed at the scaled value and fits the others.

**The rule ("not identified").**  A coefficient ``k`` is identified by a set of rows when at
least one of them is *dominated* by it: its term carries more than ``threshold`` (default
:data:`THRESHOLD`, one half) of the row's modelled duration, evaluated with the coefficients
the fit starts from (no row informed them)::

    share_i = |grad_ik * theta_k| / form_i(theta)

``form_i`` the row's duration as a linear function of the coefficients
(:class:`~velvetrope.engine.replay.LinearForm`; a latency is proportional to it, a
throughput inversely, so ``share_i`` is the magnitude of the row's elasticity
``d log value_i / d log theta_k``).  Rows where the term is a minority leave ``theta_k``
traded against the other terms (a longer prefill against a shorter step floor or decode
cost fits them equally well); a row dominated by it pins it.  Only the training rows of the
fold enter the rule, never the held-out source's.  The donor must pass the same rule on its
own training rows of the fold, else nothing is borrowed (a borrowed guess is no better than
the start).

**The scale for prefill.**  A prefill token costs the model's FLOPs per token (about two
per parameter) over the GPUs' aggregate compute, so between two models on the same GPU::

    per_prefill_token_s(recipient) = per_prefill_token_s(donor)
                                     * (params_recipient / params_donor)
                                     * (gpus_donor / gpus_recipient) / tp_efficiency

(:func:`compute_scale`).  ``tp_efficiency`` is 1 unless a caller has it from elsewhere:
it is never fitted on the held-out source.  A recipient's tensor-parallel communication
stays in its own ``tp_per_token_s`` (fixed from hardware figures), which the donor on one
GPU does not pay, so nothing is subtracted.

Pure functions of the rows and profiles; deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from velvetrope.engine.fit_published import fit_profile, predict
from velvetrope.engine.profile import COEFFICIENTS, EngineProfile
from velvetrope.engine.published import PublishedPoint
from velvetrope.engine.replay import theta_of
from velvetrope.errors import PolicyError

__all__ = [
    "PARAMETERS",
    "THRESHOLD",
    "Borrow",
    "compute_scale",
    "donor_fits",
    "identified",
    "max_share",
    "shares",
]

PARAMETERS: dict[str, float] = {
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
}
"""Parameter counts (the model cards of meta-llama/Meta-Llama-3-8B and -70B on the
Hugging Face hub: 8.03 B and 70.6 B parameters; the Llama 3.1 models have the same
architecture and counts), keyed by the profile name's model prefix."""

THRESHOLD = 0.5
"""A coefficient is identified by rows when it carries more than half of some row's
modelled duration (the row is dominated by it)."""


def compute_scale(
    recipient_params: float,
    recipient_gpus: int,
    donor_params: float,
    donor_gpus: int,
    tp_efficiency: float = 1.0,
) -> float:
    """The factor from the donor's prefill cost per token to the recipient's: the FLOPs
    ratio over the compute ratio, over ``tp_efficiency`` (in ``(0, 1]``).  Raises
    :class:`~velvetrope.errors.PolicyError` for non-positive counts or efficiency."""
    if min(recipient_params, donor_params) <= 0 or min(recipient_gpus, donor_gpus) < 1:
        raise PolicyError("parameter counts must be > 0 and GPU counts >= 1")
    if not 0 < tp_efficiency <= 1:
        raise PolicyError(f"tp_efficiency must be in (0, 1], got {tp_efficiency}")
    return (recipient_params / donor_params) * (donor_gpus / recipient_gpus) / tp_efficiency


def shares(
    points: Sequence[PublishedPoint], profile: EngineProfile, coefficient: str, seed: int = 0
) -> list[float]:
    """Each row's ``|grad_k * theta_k| / duration`` at ``profile``'s coefficients (the rows'
    order as :func:`~velvetrope.engine.fit_published.predict` returns them)."""
    if coefficient not in COEFFICIENTS:
        raise PolicyError(f"not a coefficient: {coefficient!r}")
    k = COEFFICIENTS.index(coefficient)
    theta = theta_of(profile)
    out: list[float] = []
    for p in predict(points, profile, seed):
        total = p.form.at(theta)
        out.append(float(abs(p.form.grad[k] * theta[k]) / total) if total > 0 else 0.0)
    return out


def max_share(
    points: Sequence[PublishedPoint], profile: EngineProfile, coefficient: str, seed: int = 0
) -> float:
    """The largest of :func:`shares` (0 for no rows)."""
    return float(np.max(shares(points, profile, coefficient, seed), initial=0.0))


def identified(
    points: Sequence[PublishedPoint],
    profile: EngineProfile,
    coefficient: str,
    threshold: float,
    seed: int = 0,
) -> bool:
    """Whether some row of ``points`` is dominated by ``coefficient``: a share > ``threshold``."""
    return max_share(points, profile, coefficient, seed) > threshold


@dataclass(frozen=True)
class Borrow:
    """What a profile's held-out folds may borrow, and from whom.

    ``donors`` maps each held-out source to the donor profile fitted without that source
    (the caller builds it: e.g. the donor's own held-out fold for that source, or the
    donor fitted to all its rows when none of them is of that source), or to ``None`` when
    the donor's fit of that fold does not identify ``coefficient`` either.  A fold whose
    training rows do not identify ``coefficient`` (:func:`identified` at the fit's start,
    ``threshold``) fixes it at ``donors[source].<coefficient> * scale``; a fold with no
    donor entry borrows nothing.
    """

    coefficient: str
    scale: float
    threshold: float
    donor: str
    donors: Mapping[str, EngineProfile | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.coefficient not in COEFFICIENTS:
            raise PolicyError(f"borrow: not a coefficient: {self.coefficient!r}")
        if self.scale <= 0 or not 0 < self.threshold < 1:
            raise PolicyError("borrow: scale must be > 0 and threshold in (0, 1)")

    def value(self, source: str) -> float | None:
        """The scaled donor coefficient for the fold holding ``source`` out, or ``None``."""
        donor = self.donors.get(source)
        if donor is None:
            return None
        return float(getattr(donor, self.coefficient)) * self.scale


def donor_fits(
    points: Sequence[PublishedPoint],
    profile: EngineProfile,
    start: Mapping[str, float],
    sources: Sequence[str],
    coefficient: str,
    threshold: float,
    *,
    fixed: Mapping[str, float] | None = None,
    known: Mapping[str, EngineProfile] | None = None,
    max_iter: int = 8,
    seed: int = 0,
) -> dict[str, EngineProfile | None]:
    """The donor's fit for each held-out source of ``sources``: ``profile`` fitted from
    ``start`` (with ``fixed``) to the rows of ``points`` (the donor's) whose source is not
    the held-out one, or ``None`` when those rows do not identify ``coefficient`` (or there
    are none).  ``known`` may give fits already made for a held-out source (e.g. the
    donor's own held-out folds; the caller guarantees they exclude that source); fits on
    the same training sources are made once."""
    base = profile.with_overrides(**start)
    check = base.with_overrides(**(fixed or {}))
    out: dict[str, EngineProfile | None] = {}
    made: dict[frozenset[str], EngineProfile | None] = {}
    for source in sources:
        train = [p for p in points if p.source != source]
        key = frozenset(p.source for p in train)
        if key not in made:
            if not train or not identified(train, check, coefficient, threshold, seed):
                made[key] = None
            elif known is not None and source in known:
                made[key] = known[source]
            else:
                made[key] = fit_profile(
                    train, base, fixed=fixed, max_iter=max_iter, seed=seed
                ).profile
        out[source] = made[key]
    return out
