"""Held-out validation of a fitted engine profile: fit on some sources, test on the others.

The rows of a profile (one engine version on one piece of hardware) come from several
published sources.  :func:`holdout` holds each source out in turn: the profile's
coefficients are fitted (:func:`~velvetrope.engine.fit_published.fit_profile`) to the rows
of the *other* sources, starting from coefficients that no row informed (``start``, e.g.
the datasheet-derived ones), and the held-out source's rows are replayed with that fit.
Each held-out row is therefore predicted by a profile that never saw its source.

A profile whose rows all come from one source has nothing left to fit on: its rows are
replayed with the coefficients of ``fallback`` (fitted elsewhere, e.g. the same hardware's
profile of another engine version, whose rows are other sources by construction), set into
the profile itself.  Without a fallback such a profile yields no fold.

With a :class:`~velvetrope.engine.borrow.Borrow`, a fold whose training rows do not
identify the borrowed coefficient (:func:`~velvetrope.engine.borrow.identified`, evaluated
at the fit's start) fixes it at the donor's value of the same fold times the physical
scale, and fits the rest; the fold records what it borrowed.  Folds whose rows identify the
coefficient, and the fitted (not held-out) profiles, are untouched.

Every replay, training or held-out, runs the profile's own scheduler (``profile.scheduler``,
what every user of the profile gets), configured as each row's source ran it
(:func:`~velvetrope.engine.replay.engine_for`).  Deterministic; the cost is one fit per
source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from velvetrope.engine.borrow import Borrow, identified
from velvetrope.engine.fit_published import fit_profile, predict
from velvetrope.engine.profile import COEFFICIENTS, EngineProfile
from velvetrope.engine.published import PublishedPoint
from velvetrope.engine.replay import Prediction
from velvetrope.errors import PolicyError

__all__ = ["Fold", "holdout"]


@dataclass(frozen=True)
class Fold:
    """One held-out source: what predicted it, and the predictions of its rows."""

    profile: str
    source: str
    trained_on: tuple[str, ...]
    """The sources the predicting coefficients were fitted to (empty for a fallback)."""
    fitted: EngineProfile
    predictions: tuple[Prediction, ...]
    borrowed: tuple[tuple[str, float], ...] = ()
    """The coefficients fixed from a donor's fit of the same fold (name, value)."""


def _coefficients_of(profile: EngineProfile, donor: EngineProfile) -> EngineProfile:
    return profile.with_overrides(**{k: getattr(donor, k) for k in COEFFICIENTS})


def holdout(
    points: Sequence[PublishedPoint],
    profile: EngineProfile,
    start: Mapping[str, float],
    *,
    fixed: Mapping[str, float] | None = None,
    fallback: EngineProfile | None = None,
    borrow: Borrow | None = None,
    max_iter: int = 8,
    seed: int = 0,
) -> list[Fold]:
    """One :class:`Fold` per source of ``points`` (all of ``profile``), sources sorted.

    ``start`` gives the coefficients each fold's fit starts from (every name must be one of
    :data:`~velvetrope.engine.profile.COEFFICIENTS`); ``fixed`` the coefficients not to fit
    (as :func:`~velvetrope.engine.fit_published.fit_profile`).  With a single source the
    fold replays it with ``fallback``'s coefficients, or there is no fold when
    ``fallback`` is ``None``.  ``borrow``: see the module docstring.  Raises
    :class:`~velvetrope.errors.PolicyError` for rows of another profile or a bad ``start``.
    """
    if not points:
        return []
    names = sorted({p.profile for p in points})
    if names != [profile.name]:
        raise PolicyError(f"rows of profile {profile.name!r} only, got {', '.join(names)}")
    unknown = sorted(set(start) - set(COEFFICIENTS))
    if unknown:
        raise PolicyError(f"start: not coefficients: {', '.join(unknown)}")
    base = profile.with_overrides(**start)
    sources = sorted({p.source for p in points})
    folds: list[Fold] = []
    for source in sources:
        test = [p for p in points if p.source == source]
        train = [p for p in points if p.source != source]
        borrowed: tuple[tuple[str, float], ...] = ()
        if train:
            fold_fixed = dict(fixed or {})
            if borrow is not None and borrow.coefficient not in fold_fixed:
                value = borrow.value(source)
                check = base.with_overrides(**fold_fixed)
                if value is not None and not identified(
                    train, check, borrow.coefficient, borrow.threshold, seed
                ):
                    fold_fixed[borrow.coefficient] = value
                    borrowed = ((borrow.coefficient, value),)
            fit = fit_profile(train, base, fixed=fold_fixed, max_iter=max_iter, seed=seed)
            used = fit.profile
            trained_on = tuple(s for s in sources if s != source)
        elif fallback is not None:
            used = _coefficients_of(profile, fallback)
            trained_on = ()
        else:
            continue
        preds = tuple(predict(test, used, seed))
        folds.append(Fold(profile.name, source, trained_on, used, preds, borrowed))
    return folds
