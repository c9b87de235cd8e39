"""The fit: the profile's four step-time coefficients from the measured rows.

:func:`fit_observations` solves a bounded, weighted least-squares problem over
:class:`~velvetrope.engine.calibrate.observe.Observation` rows; :func:`build_profile` puts
the result into a profile; :func:`simulate_runs` produces the traces a client would
measure against a given profile (to check that a plan identifies it).  Pure.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from velvetrope.engine.batcher import Batcher, Tokens
from velvetrope.engine.calibrate.observe import Observation, ProbeRun, RequestTrace
from velvetrope.engine.calibrate.plan import Probe
from velvetrope.engine.profile import COEFFICIENTS, EngineProfile
from velvetrope.errors import PolicyError

__all__ = [
    "Fit",
    "build_profile",
    "fit_observations",
    "relative_errors",
    "simulate_runs",
]

# -- the fit ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """A least-squares fit of the four coefficients (model seconds).

    ``stderr`` holds each coefficient's standard error (``nan`` with no spare rows).
    ``overhead_s`` is the fitted per-request overhead in TTFT and ``overhead_per_token_s``
    its part that grows with the prompt (``None`` when not fitted; see
    :func:`fit_observations`).  ``r2`` is over the rows' mean step times; residuals are
    relative, ``(measured - fitted) / measured``.  ``rows`` lists ``(kind, label, measured
    step seconds, fitted step seconds)``; ``at_bound`` names coefficients the fit pinned to
    their lower bound (not resolved by the data).
    """

    coefficients: dict[str, float]
    stderr: dict[str, float]
    overhead_s: float | None
    overhead_per_token_s: float | None
    r2: float
    rms_rel_residual: float
    max_rel_residual: float
    worst_row: str
    rows: tuple[tuple[str, str, float, float], ...]
    at_bound: tuple[str, ...] = field(default=())


_MEANING = {
    "step_base_s": "the fixed cost of a step",
    "per_prefill_token_s": "the cost of a prompt token",
    "per_decode_seq_s": "the cost of a decoding sequence",
    "per_context_token_s": "the cost of a token of context",
    "request_overhead_s": "the per-request overhead",
    "request_overhead_per_token_s": "the per-prompt-token overhead",
}


def _unidentified(
    a_s: NDArray[np.float64], names: Sequence[str], rank: int, obs: Sequence[Observation]
) -> str:
    """Why a rank-deficient design cannot be fitted, in words: which coefficients the
    measurements cannot tell apart (those with weight in the design's null space), and what
    measurement would separate them."""
    _, _, vt = np.linalg.svd(a_s)
    null = np.abs(vt[rank:])
    tangled = [n for j, n in enumerate(names) if null[:, j].max() > 1e-6]
    kinds = sorted({o.kind for o in obs})
    said = [_MEANING.get(n, n) for n in tangled]
    words = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]
    msg = (
        f"the measurements cannot tell {words} apart: in every usable measurement "
        f"({', '.join(kinds) or 'none'}) they moved together (rank {rank} of {len(names)})"
    )
    if "per_decode_seq_s" in tangled and "batch" not in kinds:
        msg += (
            "; only batch probes (several requests decoding at once) vary the number of "
            "decoding sequences, and none gave a usable window"
        )
    elif "per_prefill_token_s" in tangled and "mixed" not in kinds:
        msg += "; only mixed probes measure a prompt's cost apart from the request overhead"
    return msg


def fit_observations(
    observations: Sequence[Observation], *, jitter_s: float = 1e-3, rel_floor: float = 0.01
) -> Fit:
    """Fit :data:`COEFFICIENTS`, plus nuisance terms for what TTFT holds besides steps.

    Rows with ``requests > 0`` (TTFTs) get a per-request overhead column and, when other
    rows (``mixed``) measure the prefill cost without any overhead, a per-prompt-token
    overhead column as well (sending, parsing and tokenizing grow with the prompt; without
    it that cost would be read as prefill).  Each row is normalised to one step (``y =
    seconds / steps`` against the per-step composition) and weighted by ``1 / σ`` with
    ``σ = rel_floor · y + jitter_s / steps`` (``jitter_s``: the timing noise, in model
    seconds, at each end of an interval) combined in quadrature with the row's
    ``spread_s`` (the noise its repeats showed).  Bounded least squares keeps the
    coefficients non-negative and ``step_base_s`` positive (the nuisance terms are free).  Raises
    :class:`~velvetrope.errors.PolicyError` if the rows do not identify every unknown
    (rank-deficient design), with fewer rows than unknowns, or with bad weights.
    """
    from scipy.optimize import lsq_linear

    if not (jitter_s >= 0 and rel_floor >= 0 and jitter_s + rel_floor > 0):
        raise PolicyError("jitter_s and rel_floor must be >= 0 and not both 0")
    obs = [o for o in observations if o.steps > 0 and o.seconds > 0]
    with_overhead = any(o.requests > 0 for o in obs)
    with_per_token = with_overhead and any(o.requests == 0 and o.prefill_tokens > 0 for o in obs)
    names = [*COEFFICIENTS]
    if with_overhead:
        names.append("request_overhead_s")
    if with_per_token:
        names.append("request_overhead_per_token_s")
    p = len(names)
    if len(obs) < p:
        raise PolicyError(f"{len(obs)} usable measurements cannot determine {p} unknowns")
    x: NDArray[np.float64] = np.array(
        [
            [1.0, o.prefill_tokens / o.steps, o.decode_seqs / o.steps, o.context_tokens / o.steps]
            + ([o.requests / o.steps] if with_overhead else [])
            + ([o.request_tokens / o.steps] if with_per_token else [])
            for o in obs
        ],
        dtype=np.float64,
    )
    y: NDArray[np.float64] = np.array([o.step_seconds for o in obs], dtype=np.float64)
    sigma = rel_floor * y + jitter_s / np.array([o.steps for o in obs], dtype=np.float64)
    sigma = np.hypot(sigma, np.array([o.spread_s for o in obs], dtype=np.float64))
    a = x / sigma[:, None]
    rhs = y / sigma
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    a_s = a / scale
    rank = int(np.linalg.matrix_rank(a_s))
    if rank < p:
        raise PolicyError(_unidentified(a_s, names, rank, obs))
    lower = np.array([1e-12, 0.0, 0.0, 0.0] + [-np.inf] * (p - 4))
    upper = np.full(p, np.inf)
    res = lsq_linear(a_s, rhs, bounds=(lower * scale, upper * scale), method="bvls")
    theta: NDArray[np.float64] = np.asarray(res.x, dtype=np.float64) / scale
    fitted = x @ theta
    resid_w = a @ theta - rhs
    dof = len(obs) - p
    if dof > 0:
        s2 = float(resid_w @ resid_w) / dof
        cov_s = s2 * np.linalg.pinv(a_s.T @ a_s)
        se = np.sqrt(np.clip(np.diag(cov_s), 0.0, None)) / scale
    else:
        se = np.full(p, np.nan)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - fitted) ** 2).sum())
    rel = (y - fitted) / y
    worst = int(np.argmax(np.abs(rel)))
    at_bound = tuple(
        n for n, v, lo in zip(names[:4], theta[:4], lower[:4], strict=True) if v <= lo * 1.000001
    )
    return Fit(
        coefficients={n: float(v) for n, v in zip(COEFFICIENTS, theta[:4], strict=True)},
        stderr={n: float(v) for n, v in zip(COEFFICIENTS, se[:4], strict=True)},
        overhead_s=float(theta[4]) if with_overhead else None,
        overhead_per_token_s=float(theta[5]) if with_per_token else None,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        rms_rel_residual=float(np.sqrt((rel**2).mean())),
        max_rel_residual=float(np.abs(rel[worst])),
        worst_row=f"{obs[worst].kind}: {obs[worst].label}",
        rows=tuple(
            (o.kind, o.label, float(yy), float(ff))
            for o, yy, ff in zip(obs, y, fitted, strict=True)
        ),
        at_bound=at_bound,
    )


def relative_errors(fitted: EngineProfile, reference: EngineProfile) -> dict[str, float]:
    """``|fitted - reference| / reference`` per coefficient (``inf`` if the reference is 0
    and the fit is not)."""
    out: dict[str, float] = {}
    for n in COEFFICIENTS:
        f, r = getattr(fitted, n), getattr(reference, n)
        out[n] = abs(f - r) / r if r else (0.0 if f == 0 else math.inf)
    return out


def build_profile(fit: Fit, base: EngineProfile, name: str, description: str) -> EngineProfile:
    """``base`` with the fitted coefficients: KV-cache and scheduler limits are kept.

    Measured timings include any tensor-parallel communication, so the base's separate
    ``tp_*`` terms are zeroed (they would be counted twice)."""
    return base.with_overrides(
        name=name, description=description, tp_allreduce_s=0.0, tp_per_token_s=0.0,
        **fit.coefficients,
    )  # fmt: skip


# -- a simulated endpoint (pure): traces from the batcher model itself -----------------------


def simulate_runs(
    profile: EngineProfile,
    plan: Sequence[Probe],
    *,
    speed: float = 1.0,
    overhead_s: float = 0.0,
    jitter_s: float = 0.0,
    seed: int = 0,
) -> list[ProbeRun]:
    """What a client would measure if ``plan`` ran against an engine exactly like
    ``profile`` (stepped by a :class:`~velvetrope.engine.batcher.Batcher` in virtual time).

    Wall times are model times divided by ``speed``.  Each request reaches the engine
    ``overhead_s`` (model seconds) after it is sent; batch requests are sent 0.05 ms
    apart (a staggered burst); a mixed probe's guest is sent when the host's chunk
    ``guest_after`` arrives.  Every chunk arrives ``U(0, jitter_s)`` after its step ends
    (kept in order).  Prompt and output counts are the probe's targets.  Useful to check that a plan
    identifies a profile before spending an endpoint's time on it.
    """
    rng = random.Random(seed)
    runs: list[ProbeRun] = []
    for probe in plan:
        runs.append(_simulate_probe(profile, probe, speed, overhead_s, jitter_s, rng))
    return runs


def _simulate_probe(
    profile: EngineProfile,
    probe: Probe,
    speed: float,
    overhead_s: float,
    jitter_s: float,
    rng: random.Random,
) -> ProbeRun:
    b = Batcher(profile)
    arrivals: list[tuple[float, str, int, int]] = []
    sent: dict[str, float] = {}
    if probe.kind == "batch":
        for i in range(probe.streams):
            s = i * 5e-5
            sent[f"r{i}"] = s
            arrivals.append((s + overhead_s, f"r{i}", probe.prompt_tokens, probe.output_tokens))
        order = [f"r{i}" for i in range(probe.streams)]
    else:
        sent["r0"] = 0.0
        arrivals.append((overhead_s, "r0", probe.prompt_tokens, probe.output_tokens))
        order = ["r0", "g"] if probe.kind == "mixed" else ["r0"]
    chunks: dict[str, list[float]] = {sid: [] for sid in order}
    counts: dict[str, tuple[int, int]] = {}
    now = 0.0
    while True:
        arrivals.sort()
        while arrivals and arrivals[0][0] <= now:
            _, sid, pr, out = arrivals.pop(0)
            b.add(sid, pr, out, now)
            counts[sid] = (pr, out)
        if not b.has_work:
            if not arrivals:
                break
            now = arrivals[0][0]
            continue
        r = b.step(now)
        now = r.end
        for e in r.events:
            if isinstance(e, Tokens):
                t = e.t + rng.uniform(0.0, jitter_s)
                ch = chunks[e.seq_id]
                ch.append(max(t, ch[-1]) if ch else t)
                if probe.kind == "mixed" and e.seq_id == "r0" and len(ch) == probe.guest_after:
                    sent["g"] = ch[-1]
                    arrivals.append((ch[-1] + overhead_s, "g", probe.guest_prompt_tokens, 1))
    traces = tuple(
        RequestTrace(
            sent[sid] / speed,
            tuple(c / speed for c in chunks[sid]),
            counts[sid][0],
            counts[sid][1],
        )
        for sid in order
    )
    return ProbeRun(probe, traces)
