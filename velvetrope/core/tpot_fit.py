"""The fit behind the TPOT limit: time per output token against the batch and the prefill
that shares its steps (:class:`TpotSamples`, :class:`TpotFit`).

A continuously batching engine's step decodes every running sequence once and spends the
rest of its token budget on prefill chunks, so the time a request waits per output token is

    ``tpot ≈ a + b·n + c·p``

with ``n`` the sequences in flight per engine while it decoded and ``p`` the prompt tokens
the engine prefilled per decode step meanwhile.  Both are measured per request
(:mod:`velvetrope.core.tpot_limit`).  Fitting ``tpot`` on ``n`` alone confounds the two:
a burst of arrivals raises ``n`` and the prefill together, and a line through such samples
charges each sequence for the prefill, a slope many times the decode's own (seen on
prefill-heavy traces: a limit of tens per engine where the engines meet the objective at
hundreds).

What the limit controls is ``n``; the prefill follows it.  In a steady state each request in
flight was prefilled once, so the prefill per step grows in proportion to the batch,
``p ≈ r·n`` with ``r = p̄ / n̄`` measured, up to the most the engines have been seen to
prefill per step (their chunk budget, once they have been saturated with prompts).  The
TPOT at a batch of ``n`` is then the lesser of two lines:

* proportional: ``a + (b + c·r)·n``, whose samples' spread ``σ_line`` around it includes the
  prefill's variation around its proportional share;
* saturated: ``a + b·n + c·p_max``, the prefill at its largest, with the fit's residual
  spread ``σ``.

The proportional line's spread is taken two ways.  ``σ_line`` is the samples' own, the
same at every batch.  But the prefill a request shares its steps with is that of the
prompts that arrive while it decodes, about ``n`` of them in a batch of ``n``: its
deviation from ``r·n`` is a sum of about ``n`` prompts' deviations, and its variance grows
in proportion to the batch, ``k²·n`` with ``k² = mean((p − r·n)² / n)`` over the samples
(tokens² per sequence).  At the samples' own batch the two agree; below it the second is
narrower.  It matters when the first samples all come from a ramp: a cold start's burst
prefills far more per step than the steady state, ``σ_line`` then exceeds the objective on
its own (the limit would fall to 1 per engine for as long as those samples weigh), while
``c·k·√n`` at a small batch does not (seen on one 70B engine with long prompts at 1.1×:
``σ_line`` 45 ms, 7.5 ms around the full fit).

:meth:`TpotFit.per_engine` is the largest ``n`` at which one of them, plus ``z`` of its
spread (for the proportional line, the batch at which either spread reaches the objective,
the larger: :meth:`TpotFit.reach`), is within the objective.  :meth:`TpotFit.reach_uniform`
leaves out the narrower spread at batches below the samples': the verdict that no batch
reaches the objective (:mod:`velvetrope.core.tpot_limit` lets the top tier pass then) rests
on no extrapolation below what was seen.  When the two causes cannot be told apart (no spread of
``p``, ``n`` and ``p`` moving together, a TPOT that falls as the prefill grows, or a
prefill term too small to matter: less than a tenth of the mean TPOT at the most prefill
seen, as with short prompts), the fit is the line on ``n`` alone (``c = 0``).  A cost per
sequence that comes out negative (with the prefill's positive, it does only when the
prefill alone explains more of the TPOT than the batch alone) means the decode's own cost is
too small to measure beside the prefill's: the fit is then on the prefill with ``b = 0``,
the least-squares fit under ``b ≥ 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

__all__ = ["TpotFit", "TpotSamples"]

_INF: Final = math.inf
_MAX_CORRELATION_SQ: Final = 0.99
"""Above this squared correlation of ``n`` and ``p`` the two slopes are not identified."""
_MIN_PREFILL_SHARE: Final = 0.1
"""A prefill term that adds less than this share of the mean TPOT at the most prefill seen
is noise, not a cause (short prompts): the fit is then the line on ``n`` alone."""


@dataclass(frozen=True, slots=True)
class TpotFit:
    """``tpot ≈ base_s + per_seq_s·n + per_prefill_token_s·p`` and what the limit needs of
    the samples (module docstring).  ``per_prefill_token_s`` is 0 for the line on ``n``
    alone, whose ``line_sd_s`` equals ``sd_s``; ``prefill_var_per_seq`` is ``k²`` (module
    docstring), 0 for that line."""

    base_s: float
    per_seq_s: float
    sd_s: float
    per_prefill_token_s: float = 0.0
    prefill_per_seq: float = 0.0
    prefill_max: float = 0.0
    line_sd_s: float = 0.0
    prefill_var_per_seq: float = 0.0

    def per_engine(self, target_s: float, z: float) -> float:
        """The most in flight per engine at which the predicted TPOT plus ``z`` spreads is
        within ``target_s`` (:meth:`reach`, at least 1; ``inf`` when no batch reaches it)."""
        return max(1.0, self.reach(target_s, z))

    def reach(self, target_s: float, z: float) -> float:
        """The batch per engine at which the predicted TPOT plus ``z`` spreads reaches
        ``target_s``, not floored: under 1 when even a batch of one is predicted to miss it,
        ``inf`` when the predicted TPOT does not grow with the batch.  The proportional
        line's spread is the larger of the batch-independent and the growing one's reach
        (module docstring)."""
        n = self.reach_uniform(target_s, z)
        c = self.per_prefill_token_s
        if c > 0.0:
            slope = self.per_seq_s + c * self.prefill_per_seq
            k = c * math.sqrt(self.prefill_var_per_seq)
            n = max(n, _reach_growing(target_s - self.base_s, slope, z * self.sd_s, z * k))
        return n

    def reach_uniform(self, target_s: float, z: float) -> float:
        """:meth:`reach` with the proportional line's spread the samples' own at every
        batch (``line_sd_s``), none narrower below their batch."""
        c = self.per_prefill_token_s
        b = self.per_seq_s
        slope = b + c * self.prefill_per_seq
        n = (target_s - z * self.line_sd_s - self.base_s) / slope if slope > 0 else _INF
        if c > 0.0:
            left = target_s - z * self.sd_s - self.base_s - c * self.prefill_max
            saturated = left / b if b > 0 else (_INF if left > 0 else -_INF)
            n = max(n, saturated)
        return n


def _reach_growing(room: float, slope: float, e: float, k: float) -> float:
    """The largest ``n`` with ``slope·n + √(e² + k²·n) ≤ room`` (``slope > 0``; ``e, k ≥
    0``): the smaller root of ``(room − slope·n)² = e² + k²·n``; negative when ``room ≤ e``
    (out of reach at any batch)."""
    if room <= e:
        return room - e
    qa = slope * slope
    qb = 2.0 * slope * room + k * k
    qc = room * room - e * e
    return (qb - math.sqrt(max(0.0, qb * qb - 4.0 * qa * qc))) / (2.0 * qa)


class TpotSamples:
    """Weighted sums of ``(n, p, tpot)`` samples and their least-squares fit.

    Each sample's weight halves every ``half_life`` samples after it.  :meth:`solve` is ``None``
    until ``min_samples`` samples spanning at least ``min_spread`` in ``n`` are in, or while
    the TPOT does not grow with ``n`` (by less than 0.1% of its mean over the range seen).
    """

    __slots__ = (
        "_decay",
        "_pmax",
        "_s",
        "_sp",
        "_spp",
        "_sppn",
        "_spy",
        "_sx",
        "_sxp",
        "_sxx",
        "_sxy",
        "_sy",
        "_syy",
        "count",
        "min_samples",
        "min_spread",
        "xmax",
        "xmin",
    )

    def __init__(self, *, half_life: float, min_samples: int, min_spread: float) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self.min_samples = min_samples
        self.min_spread = min_spread
        self.count = 0
        self.xmin = _INF
        self.xmax = -_INF
        self._pmax = 0.0
        self._s = self._sx = self._sp = self._sy = 0.0
        self._sxx = self._sxp = self._spp = self._sxy = self._spy = self._syy = 0.0
        self._sppn = 0.0  # Σ w·p²/n, for k² (module docstring)

    def add(self, x: float, p: float, y: float, w: float = 1.0) -> None:
        """One sample of weight ``w``: ``x`` in flight per engine, ``p`` prefill tokens per
        step, TPOT ``y``."""
        d = self._decay
        self._s = self._s * d + w
        self._sx = self._sx * d + w * x
        self._sp = self._sp * d + w * p
        self._sy = self._sy * d + w * y
        self._sxx = self._sxx * d + w * x * x
        self._sxp = self._sxp * d + w * x * p
        self._spp = self._spp * d + w * p * p
        self._sppn = self._sppn * d + (w * p * p / x if x > 0.0 else 0.0)
        self._sxy = self._sxy * d + w * x * y
        self._spy = self._spy * d + w * p * y
        self._syy = self._syy * d + w * y * y
        self.count += 1
        self.xmin = min(self.xmin, x)
        self.xmax = max(self.xmax, x)
        self._pmax = max(self._pmax, p)

    def solve(self) -> TpotFit | None:
        """The fit of the samples so far (module docstring), or ``None`` while unknown."""
        if self.count < self.min_samples or self.xmax - self.xmin < self.min_spread:
            return None
        s = self._s
        mx, mp, my = self._sx / s, self._sp / s, self._sy / s
        vxx = self._sxx / s - mx * mx
        if vxx <= 1e-12:
            return None
        vpp = self._spp / s - mp * mp
        cxp = self._sxp / s - mx * mp
        cxy = self._sxy / s - mx * my
        cpy = self._spy / s - mp * my
        vyy = self._syy / s - my * my
        flat = 1e-3 * my
        det = vxx * vpp - cxp * cxp
        if vpp > 1e-12 and det > (1.0 - _MAX_CORRELATION_SQ) * vxx * vpp and mx > 0.0:
            b = (vpp * cxy - cxp * cpy) / det
            c = (vxx * cpy - cxp * cxy) / det
            if b < 0.0 and c > 0.0:  # no cost per sequence measurable: the fit with b = 0
                b, c = 0.0, cpy / vpp
            if c > 0.0 and c * self._pmax >= _MIN_PREFILL_SHARE * my:
                r = mp / mx
                slope = b + c * r
                if slope * (self.xmax - self.xmin) <= flat:
                    return None
                return TpotFit(
                    base_s=my - b * mx - c * mp,
                    per_seq_s=b,
                    sd_s=math.sqrt(max(0.0, vyy - b * cxy - c * cpy)),
                    per_prefill_token_s=c,
                    prefill_per_seq=r,
                    prefill_max=self._pmax,
                    line_sd_s=math.sqrt(max(0.0, vyy - 2.0 * slope * cxy + slope * slope * vxx)),
                    prefill_var_per_seq=max(0.0, self._sppn / s - 2.0 * r * mp + r * r * mx),
                )
        b = cxy / vxx
        if b * (self.xmax - self.xmin) <= flat:  # flat (or falling) over the range
            return None
        sd = math.sqrt(max(0.0, vyy - b * cxy))
        return TpotFit(base_s=my - b * mx, per_seq_s=b, sd_s=sd, line_sd_s=sd)
