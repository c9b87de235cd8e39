"""Fit an engine profile to published benchmark results (``velvetrope calibrate --from-table``).

The live calibration (:mod:`velvetrope.engine.calibrate`) times a running endpoint; this
module fits the same step-time coefficients to numbers other people published (the
table of :mod:`velvetrope.engine.published`).  Each published run is replayed on the
engine model (:mod:`velvetrope.engine.replay`) with the engine configuration the source
ran, and the four coefficients

    step_base_s, per_prefill_token_s, per_decode_seq_s, per_context_token_s

are chosen to minimise the squared relative errors between the model and the table::

    sum_i  w_i * rho((model_i(theta) / published_i - 1) ** 2)

where ``w_i = 1 / n_m``, ``n_m`` the number of rows of the row's metric (throughput, TTFT,
TPOT and E2E latency weigh the same in total, however many rows each has), halved for rows
marked ``approx`` (read from a plot).  The tensor-parallel terms (``tp_allreduce_s``,
``tp_per_token_s``) are not fitted: they are fixed from hardware figures in the profile, and
the fitted coefficients are what remains beyond them.  Every row is replayed in the
profile's own scheduler (``profile.scheduler``), the one every user of the profile runs.

``max_num_seqs`` is the engine's real batch limit: rows that publish it run with it; when
some rows do not (a blog post that gives the command line but not every default it
changed), the profile's ``max_num_seqs`` is fitted too, by trying each of
:data:`SEAT_CANDIDATES` and keeping the best (a burst of 500 requests that ran as one wave
tells 512 from 256).

**Algorithm.**  A replay gives, for a fixed schedule, every metric as an exact function of
the coefficients (linear forms).  The fit alternates: replay with the current coefficients,
solve the bounded least-squares problem on those forms (:func:`scipy.optimize.least_squares`
with a ``soft_l1`` loss, close to minimising absolute relative errors, coefficients >= 0,
``step_base_s > 0``) inside a trust region (each coefficient within a factor 2 of the
current one, since the forms are exact only near the schedule they came from), and replay
again with the solution, until the coefficients move by less than ``tol`` (relative) or
``max_iter`` replays were made.  The reported errors always come from a final replay, never
from the forms.

Bad inputs (no rows for the profile, rows of several profiles) raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares

from velvetrope.engine.profile import COEFFICIENTS, EngineProfile
from velvetrope.engine.published import Metric, PublishedPoint, scenarios
from velvetrope.engine.replay import Prediction, replay, theta_of
from velvetrope.errors import PolicyError

__all__ = [
    "METRICS",
    "SEAT_CANDIDATES",
    "TableFit",
    "fit_profile",
    "mape",
    "predict",
    "summary_line",
]

FloatArray = NDArray[np.float64]

METRICS: tuple[Metric, ...] = ("throughput", "ttft", "tpot", "e2e")
_FLOOR = 1e-5  # step_base_s must stay > 0


@dataclass(frozen=True)
class TableFit:
    """The fitted profile and how well it reproduces the rows it was fitted to."""

    profile: EngineProfile
    base: EngineProfile
    predictions: tuple[Prediction, ...]
    replays: int
    converged: bool

    @property
    def mape(self) -> dict[str, float]:
        """Mean absolute percentage error per metric (``nan`` for a metric with no row)."""
        return mape(self.predictions)


def mape(predictions: Sequence[Prediction]) -> dict[str, float]:
    """Mean ``|model - published| / published`` per metric (``nan`` if it has no row)."""
    out: dict[str, float] = {}
    for m in METRICS:
        errs = [abs(p.rel_error) for p in predictions if p.point.metric == m]
        out[m] = float(np.mean(errs)) if errs else math.nan
    return out


def summary_line(
    predictions: Sequence[Prediction], heldout: Sequence[Prediction] | None = None
) -> str:
    """``fidelity: points=<n> throughput_mape=<a> ttft_mape=<b> tpot_mape=<c>``; with
    ``heldout`` predictions, ``heldout_points=<h>`` after ``points`` and the held-out
    ``heldout_<metric>_mape`` figures at the end.  ``nan`` for a metric with no row."""
    shown = ("throughput", "ttft", "tpot")
    m = mape(predictions)
    cells = [f"fidelity: points={len(predictions)}"]
    if heldout is not None:
        cells.append(f"heldout_points={len(heldout)}")
    cells += [f"{k}_mape={m[k]:.3f}" for k in shown]
    if heldout is not None:
        h = mape(heldout)
        cells += [f"heldout_{k}_mape={h[k]:.3f}" for k in shown]
    return " ".join(cells)


def predict(
    points: Sequence[PublishedPoint], profile: EngineProfile, seed: int = 0
) -> list[Prediction]:
    """Replay every row of ``points`` (one profile) with ``profile``."""
    preds: list[Prediction] = []
    for s in scenarios(points, seed=seed):
        preds.extend(replay(s, profile))
    return preds


def _weights(points: Sequence[PublishedPoint]) -> FloatArray:
    per_metric = Counter(p.metric for p in points)
    return np.array(
        [(0.5 if p.approx else 1.0) / per_metric[p.metric] for p in points], dtype=np.float64
    )


def _solve(
    preds: Sequence[Prediction], theta0: FloatArray, reach: float, free: NDArray[np.bool_]
) -> FloatArray:
    """One least-squares solve on the linear forms, within ``[theta0 / reach, theta0 * reach]``.

    The forms are exact only for the schedule they were recorded on, so each solve stays
    in a trust region around the coefficients that produced it; the next replay re-centres.
    """
    w = np.sqrt(_weights([p.point for p in preds]))
    obs = np.array([p.point.value for p in preds])

    full = theta0.copy()

    def residuals(x: FloatArray) -> FloatArray:
        full[free] = x
        model = np.array([p.at(full) for p in preds], dtype=np.float64)
        r: FloatArray = w * (model / obs - 1.0)
        return r

    floor = np.array([_FLOOR, 1e-9, 1e-9, 1e-12])[free]
    start = np.maximum(theta0[free], floor)
    lower = np.maximum(start / reach, np.array([_FLOOR, 0.0, 0.0, 0.0])[free])
    sol = least_squares(
        residuals,
        start,
        bounds=(lower, start * reach),
        x_scale=start,
        loss="soft_l1",
        f_scale=0.05,
    )
    out: FloatArray = theta0.copy()
    out[free] = sol.x
    return out


def _coefficients(
    points: Sequence[PublishedPoint],
    start: EngineProfile,
    free: NDArray[np.bool_],
    max_iter: int,
    tol: float,
    seed: int,
    progress: Callable[[str], None] | None,
) -> tuple[EngineProfile, int, bool]:
    """Alternate replays and trust-region solves from ``start``; see the module docstring."""
    current = start
    theta = theta_of(current)
    replays, converged = 0, False
    for _ in range(max_iter):
        preds = predict(points, current, seed)
        replays += 1
        new = _solve(preds, theta, 2.0, free)
        change = float(np.max(np.abs(new - theta) / np.maximum(np.abs(theta), 1e-12)))
        theta = new
        current = current.with_overrides(**dict(zip(COEFFICIENTS, map(float, theta), strict=True)))
        if progress is not None:
            progress(
                f"max_num_seqs {current.max_num_seqs}: replay {replays}, "
                f"coefficients moved {change:.1e}"
            )
        if change < tol:
            converged = True
            break
    rounded = current.with_overrides(
        **{k: float(f"{getattr(current, k):.4g}") for k in COEFFICIENTS}
    )
    return rounded, replays, converged


def _score(preds: Sequence[Prediction]) -> float:
    """Mean of the per-metric MAPEs (the metrics present)."""
    values = [v for v in mape(preds).values() if not math.isnan(v)]
    return float(np.mean(values))


SEAT_CANDIDATES: tuple[int, ...] = (256, 512, 1024)
"""``max_num_seqs`` values tried when some rows do not publish theirs."""


def fit_profile(
    points: Sequence[PublishedPoint],
    base: EngineProfile,
    *,
    name: str | None = None,
    description: str | None = None,
    max_iter: int = 12,
    tol: float = 1e-3,
    seed: int = 0,
    fixed: Mapping[str, float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TableFit:
    """Fit ``base``'s step-time coefficients (and its ``max_num_seqs``) to ``points``.

    ``points`` must all name one profile; ``base`` supplies everything that is not fitted
    (KV cache, budget, tensor-parallel terms) and the starting coefficients.  When some rows
    leave ``max_num_seqs`` empty, each of :data:`SEAT_CANDIDATES` is tried and the one with
    the lowest mean MAPE kept (the smallest on a tie): those rows run with the profile's
    value, the others with their published one.  Otherwise the profile takes the most
    common published value.  ``fixed`` holds coefficients not to fit (their values are
    used as given; e.g. a term the rows cannot resolve, set from hardware figures).
    Returns the fitted profile (named ``name``, default ``base.name``) with a final replay
    of every row.
    """
    if not points:
        raise PolicyError("no published rows to fit")
    names = sorted({p.profile for p in points})
    if len(names) != 1:
        raise PolicyError(f"rows of one profile at a time, got {', '.join(names)}")
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed) - set(COEFFICIENTS))
    if unknown:
        raise PolicyError(
            f"cannot fix {', '.join(unknown)}: the fitted coefficients are "
            f"{', '.join(COEFFICIENTS)}"
        )
    free = np.array([c not in fixed for c in COEFFICIENTS])
    if not free.any():
        raise PolicyError("every coefficient is fixed: nothing to fit")
    base = base.with_overrides(**fixed)
    stated = [p.max_num_seqs for p in points if p.max_num_seqs is not None]
    if len(stated) == len(points):
        candidates: tuple[int, ...] = (Counter(stated).most_common(1)[0][0],)
    else:
        # vLLM needs max_num_batched_tokens >= max_num_seqs: larger seats cannot have run
        room = min(p.max_num_batched_tokens for p in points if p.max_num_seqs is None)
        candidates = tuple(c for c in SEAT_CANDIDATES if c <= room) or (room,)
    best: tuple[float, EngineProfile, tuple[Prediction, ...], int, bool] | None = None
    total = 0
    for seats in candidates:
        start = base.with_overrides(
            max_num_seqs=seats, max_num_batched_tokens=max(seats, base.max_num_batched_tokens)
        )
        prof, replays, converged = _coefficients(points, start, free, max_iter, tol, seed, progress)
        preds = tuple(predict(points, prof, seed))
        total += replays + 1
        score = _score(preds)
        if best is None or score < best[0] - 1e-12:
            best = (score, prof, preds, replays, converged)
    assert best is not None
    _, prof, preds, _, converged = best
    fitted = prof.with_overrides(
        name=name or base.name, description=description or base.description
    )
    return TableFit(fitted, base, preds, total, converged)
