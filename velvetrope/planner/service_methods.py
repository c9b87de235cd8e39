"""The service curve of one replica, three ways: the batcher in a closed loop, the formula,
or throughputs given.

Each returns a :class:`~velvetrope.planner.service.ServiceCurve` for an engine profile and a
length mix (the curve, its regularisation and the replica-as-a-queue assumption are in
:mod:`velvetrope.planner.service`):

* :func:`measure_service_curve` (**the default**): run the real sans-IO
  :class:`~velvetrope.engine.Batcher` in a *closed loop* — ``n`` requests in the engine at
  all times, each finished one replaced at once by the next of the mix — and count
  completions per second after a warm-up.  Chosen because it is the same engine model the
  simulator and the ``velvetrope engine`` server run, so it includes what no short formula
  does: KV-cache exhaustion and preemption by recompute, ``max_num_seqs``, the token budget
  and chunked prefill, head-of-line blocking at admission.  It is cheap (the whole grid
  for the 19k-request conversation mix takes about 2 s here).
* :func:`analytic_service_curve`: the closed form from the profile's linear step-time
  model.  In a closed loop each request occupies a slot for ``w_i`` iterations (its output
  tokens, plus extra iterations for a prompt longer than the token budget), so slot-time is
  length-biased and the mean iteration at concurrency ``n`` is
  ``T(n) = base + n·(pf·ΣP + dec·Σ(O−1) + ctx·ΣC)/Σw`` with ``C_i`` the KV tokens request
  ``i`` attends to summed over its life; then ``R(n) = E[w]·T(n)`` and ``X(n) = n/R(n)``,
  flat beyond the concurrency the KV cache (or ``max_num_seqs``, or the token budget)
  allows.  It ignores preemption and admission stalls, so it is optimistic near the KV
  limit; it serves as an independent cross-check of the measurement (the tests hold the two
  within a few percent below the KV limit) and as a fast model for property tests.
* :func:`curve_from_measurements`: throughputs measured elsewhere (a benchmark of the real
  engine at fixed concurrencies), regularised like a measured curve.

Speculative decoding (in the profile) and a prefix hit rate enter both methods the same way,
through the :class:`~velvetrope.planner.length_mix.LengthMix`: a request needs fewer
(verification) iterations, computes fewer prompt tokens and holds fewer private KV blocks;
the closed loop runs them in the batcher, the formula costs the mix's means.

Units: seconds, requests per second, tokens.  Bad arguments raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from velvetrope.engine.batcher import Batcher, Finished
from velvetrope.engine.profile import EngineProfile
from velvetrope.errors import PolicyError
from velvetrope.planner.length_mix import LengthMix
from velvetrope.planner.service import (
    Method,
    ServiceCurve,
    concurrency_grid,
    regularise_throughput,
)

__all__ = ["analytic_service_curve", "curve_from_measurements", "measure_service_curve"]


def _curve(
    profile: EngineProfile,
    mix: LengthMix,
    method: Method,
    grid: Sequence[int],
    throughput: Sequence[float],
    steps: Sequence[float],
    preemptions: Sequence[float],
) -> ServiceCurve:
    """Assemble a curve from raw per-concurrency values, regularising the throughput."""
    raw = np.array(throughput, dtype=np.float64)
    return ServiceCurve(
        profile=profile,
        mix=mix,
        method=method,
        concurrency=np.array(grid, dtype=np.int64),
        throughput_rps=regularise_throughput(grid, raw),
        raw_throughput_rps=raw,
        step_s=np.array(steps, dtype=np.float64),
        preemptions_per_request=np.array(preemptions, dtype=np.float64),
    )


# --------------------------------------------------------------------------- closed loop


def _check_grid(grid: Sequence[int] | None, profile: EngineProfile) -> tuple[int, ...]:
    if grid is None:
        return concurrency_grid(profile.max_num_seqs)
    g = tuple(int(n) for n in grid)
    if not g or any(n < 1 for n in g) or any(b <= a for a, b in itertools.pairwise(g)):
        raise PolicyError(f"grid must be strictly increasing concurrencies >= 1 (got {grid!r})")
    return g


_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def _closed_loop(
    profile: EngineProfile,
    mix: LengthMix,
    offset: float,
    n: int,
    warmup: int,
    measure: int,
) -> tuple[float, float, float]:
    """Throughput (req/s), mean step (s) and preemptions per request at concurrency ``n``.

    Draw ``k`` is the mix's request at quantile ``frac(offset + k·φ)`` of the work-sorted
    mix (a golden-ratio, low-discrepancy sequence): every window of consecutive draws has
    almost exactly the mix's length distribution, so a few hundred completions estimate
    the throughput as well as tens of thousands drawn at random.  With a prefix hit rate
    every request's ``mix.prefix`` leading prompt tokens are one common prefix (served from
    the cache when the profile has prefix caching on).
    """
    b = Batcher(profile, token_events=False)
    by_work = np.argsort(mix.work, kind="stable")
    prompts = mix.prompt[by_work].tolist()
    outputs = mix.output[by_work].tolist()
    prefixes = mix.prefix[by_work].tolist()
    shared = mix.prefix_hit_rate > 0
    size = len(prompts)
    nxt = 0

    def admit(now: float) -> None:
        nonlocal nxt
        i = int(((offset + nxt * _PHI) % 1.0) * size)
        if shared:
            b.add(str(nxt), prompts[i], outputs[i], now, prefix_id="shared",
                  prefix_tokens=prefixes[i])  # fmt: skip
        else:
            b.add(str(nxt), prompts[i], outputs[i], now)
        nxt += 1

    now = 0.0
    for _ in range(n):
        admit(now)
    done = 0
    target = warmup + measure
    t0 = 0.0
    pre0 = 0
    steps = 0
    busy = 0.0
    while done < target:
        res = b.step(now)
        now = res.end
        if done >= warmup:
            steps += 1
            busy += res.duration
        for e in res.events:
            if type(e) is Finished:
                done += 1
                if done == warmup:
                    t0 = now
                    pre0 = b.num_preemptions
                admit(now)
    span = now - t0
    return measure / span, busy / max(steps, 1), (b.num_preemptions - pre0) / measure


def measure_service_curve(
    profile: EngineProfile,
    prompt: ArrayLike,
    output: ArrayLike,
    *,
    grid: Sequence[int] | None = None,
    min_completions: int = 600,
    completions_per_slot: int = 3,
    saturation_gain: float = 0.01,
    seed: int = 0,
    prefix_hit_rate: float = 0.0,
) -> ServiceCurve:
    """Measure ``X(n)`` by running the batcher in a closed loop at each grid concurrency.

    At concurrency ``n`` the batcher holds ``n`` requests and each completion is replaced
    at its completion time by the next draw from the fitted mix (a low-discrepancy order
    over the mix, started at an offset set by ``seed``; see :func:`_closed_loop`).  The
    first ``max(2n, 100)`` completions warm the loop up from its synchronised start;
    throughput is the next ``max(min_completions, completions_per_slot·n)`` completions
    over the virtual time they took.  The sweep stops early, after the first doubling of
    ``n`` that raises the throughput by less than ``saturation_gain`` (relative): the
    engine is saturated there (KV cache or compute), larger ``n`` only queues inside it,
    and the curve is flat beyond the last point measured.  Deterministic.
    ``grid`` defaults to :func:`concurrency_grid` of ``max_num_seqs``.
    ``prefix_hit_rate``: the first ``prefix_hit_rate`` of every prompt is one shared prefix
    (served from the prefix cache when the profile enables it; :class:`LengthMix`).
    """
    mix = LengthMix.fit(prompt, output, profile, prefix_hit_rate)
    g = _check_grid(grid, profile)
    if min_completions < 1 or completions_per_slot < 0 or saturation_gain < 0:
        raise PolicyError(
            "min_completions must be >= 1, completions_per_slot and saturation_gain >= 0"
        )
    offset = (seed * math.sqrt(2.0)) % 1.0
    ns: list[int] = []
    xs: list[float] = []
    steps: list[float] = []
    pre: list[float] = []
    for n in g:
        x, st, pr = _closed_loop(
            profile,
            mix,
            offset,
            n,
            max(2 * n, 100),
            max(min_completions, completions_per_slot * n),
        )
        ns.append(n)
        xs.append(x)
        steps.append(st)
        pre.append(pr)
        if len(xs) >= 2 and n >= 2 * ns[-2] and x < xs[-2] * (1.0 + saturation_gain):
            break
    return _curve(profile, mix, "closed-loop", ns, xs, steps, pre)


# --------------------------------------------------------------------------- analytic


def analytic_service_curve(
    profile: EngineProfile,
    prompt: ArrayLike,
    output: ArrayLike,
    *,
    grid: Sequence[int] | None = None,
    prefix_hit_rate: float = 0.0,
) -> ServiceCurve:
    """``X(n)`` from the profile's linear step-time model (see the module docstring).

    Per slot-iteration averages are length-biased (a request holds its slot for ``w_i``
    iterations): computed prefill tokens ``Σ(P−cached)/Σw``, decode steps ``Σsteps/Σw``,
    verified draft tokens ``Σdraft/Σw``, attended KV tokens ``ΣC/Σw`` (the
    :class:`LengthMix` of ``prefix_hit_rate`` and the profile's speculative decoding).  Each
    is costed as :meth:`~velvetrope.engine.profile.EngineProfile.step_time` costs it (tensor
    parallel terms included; a speculative step pays the draft model once).  The usable
    concurrency is capped by ``max_num_seqs``, by the KV cache (the cached prefix blocks
    held once, then ``num_gpu_blocks·block_size`` over the mean private KV footprint of a
    running sequence, rounded up to whole blocks) and by the token budget
    (``max_num_batched_tokens`` over the mean tokens scheduled per sequence and iteration);
    beyond the cap ``X`` is flat.
    """
    mix = LengthMix.fit(prompt, output, profile, prefix_hit_rate)
    g = _check_grid(grid, profile)
    sw = float(mix.work.sum())
    prefill = float((mix.prompt - mix.cached).sum()) / sw
    decode = float(mix.steps.sum()) / sw
    verify = float(mix.draft.sum()) / sw
    ctx = float(mix.kv_tokens.sum()) / sw
    shared = float((mix.cached * mix.work).sum()) / sw  # cached tokens per slot-iteration
    token = profile.per_prefill_token_s + profile.tp_per_token_s
    per_seq = (
        token * (prefill + verify)
        + (profile.per_decode_seq_s + profile.tp_per_token_s) * decode
        + profile.per_context_token_s * ctx
    )
    fixed = profile.step_base_s + profile.tp_allreduce_s
    if profile.spec_tokens:
        fixed += profile.spec_tokens * profile.spec_draft_step_s
    kv_footprint = ctx - shared + profile.block_size / 2.0
    kv_free = profile.kv_capacity_tokens() - float(mix.cached.max())
    cap = min(
        float(profile.max_num_seqs),
        kv_free / kv_footprint,
        profile.max_num_batched_tokens / (prefill + decode + verify),
    )
    ew = mix.mean_work
    xs, steps = [], []
    for n in g:
        m = min(float(n), cap)
        t = fixed + m * per_seq
        xs.append(m / (ew * t))
        steps.append(t)
    return _curve(profile, mix, "analytic", g, xs, steps, [0.0] * len(g))


# --------------------------------------------------------------------------- given


def curve_from_measurements(
    profile: EngineProfile,
    prompt: ArrayLike,
    output: ArrayLike,
    concurrency: Sequence[int],
    throughput_rps: Sequence[float],
) -> ServiceCurve:
    """A curve from throughputs measured elsewhere (a benchmark of the real engine at fixed
    concurrencies, say), for the length mix ``prompt``/``output`` they were measured with.

    ``concurrency`` strictly increasing from >= 1, ``throughput_rps`` > 0 (req/s), aligned;
    regularised like a measured curve.  ``step_s`` is unknown and recorded as ``nan``.
    """
    mix = LengthMix.fit(prompt, output, profile)
    g = [int(n) for n in concurrency]
    unknown = [math.nan] * len(g)
    return _curve(profile, mix, "given", g, list(throughput_rps), unknown, unknown)
