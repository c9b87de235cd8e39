"""The effective service rate of one engine replica, derived from the engine model.

A continuous-batching engine is not one server with a fixed rate μ.  Every iteration
advances every running sequence by one token, so more concurrency means more requests
finished per second, but each iteration also takes longer (more decodes, more KV-cache
reads, more prefill chunks squeezed in): throughput rises and flattens while the time
each request spends in the engine keeps growing.  Long generations make every iteration
longer for everyone (convoys), and when the KV cache runs out the engine preempts and
throughput stops rising at all.

The service curve
-----------------
:class:`ServiceCurve` holds, for a given :class:`~velvetrope.engine.EngineProfile` and length
mix, the throughput ``X(n)`` (requests/s) and the mean residence ``R(n) = n / X(n)``
(seconds a request spends in the engine, by Little's law) at a fixed concurrency ``n``, on
the grid ``n ∈ {1, 2, 4, …, max_num_seqs}`` (:func:`concurrency_grid`).  Two ways to get it:

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

Speculative decoding (in the profile) and a prefix hit rate enter both methods the same way,
through the :class:`LengthMix`: a request needs fewer (verification) iterations, computes
fewer prompt tokens and holds fewer private KV blocks; the closed loop runs them in the
batcher, the formula costs the mix's means.

Measured curves are *regularised*: ``X`` is replaced by the least concave majorant of the
points ``(0, 0), (n, X(n))`` and then made non-decreasing (a flat top), which removes
sampling noise without moving a well-measured point by more than the noise.  A concave
``X`` with ``X(0) = 0`` makes ``R(n)`` non-decreasing, the property the queueing model
(:mod:`velvetrope.planner.predict`) and the sizing search rely on.  Between grid points
``X`` is interpolated linearly (which keeps it concave) and beyond the grid it is flat.

A replica as a queue (the modelling assumption)
-----------------------------------------------
A replica running ``n`` requests behaves like ``n`` *virtual servers*, each serving its
request at the rate ``1/R(n)`` that the concurrency implies: the replica completes
requests at the load-dependent rate ``X(n) = n/R(n)``.  This is the flow-equivalent
server (Chandy, Herzog & Woo, "Parametric analysis of queuing networks", IBM J. Res. Dev.
19, 1975): the engine, measured at each fixed population, replaced by one state-dependent
server.  It is exact for product-form networks and an approximation here; the simulator
checks it.  Because ``R(n)`` grows with ``n``, the *effective* per-request service rate
``μ_eff = 1/R(n)`` falls as the offered load (and so the concurrency) rises — the seed's
observation, made quantitative by :func:`effective_service`.

A request's own service time is taken proportional to its iterations:
``S_i = w_i · τ`` with ``τ = R(n)/E[w]`` the mean time per iteration at the operating
point: under continuous batching every running sequence advances exactly one iteration at
a time, so requests differ in how many iterations they need, not in how fast they go.

Units: seconds, requests per second, tokens.  Bad arguments raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from velvetrope.engine.batcher import Batcher, Finished
from velvetrope.engine.profile import EngineProfile
from velvetrope.engine.speculative import steps_moments
from velvetrope.errors import PolicyError

__all__ = [
    "EffectiveService",
    "LengthMix",
    "ServiceCurve",
    "analytic_service_curve",
    "concurrency_grid",
    "curve_from_measurements",
    "effective_service",
    "measure_service_curve",
    "regularise_throughput",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Method = Literal["closed-loop", "analytic", "given"]


def concurrency_grid(max_num_seqs: int) -> tuple[int, ...]:
    """``(1, 2, 4, …)`` up to and including ``max_num_seqs`` (appended if not a power of 2)."""
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise PolicyError(f"max_num_seqs must be an int >= 1 (got {max_num_seqs!r})")
    grid = [1 << k for k in range(max_num_seqs.bit_length()) if 1 << k <= max_num_seqs]
    if grid[-1] != max_num_seqs:
        grid.append(max_num_seqs)
    return tuple(grid)


# --------------------------------------------------------------------------- length mix


@dataclass(frozen=True, eq=False)
class LengthMix:
    """(prompt, output) pairs fitted to one engine, and the iterations each one needs.

    Built by :meth:`fit`.  ``output >= 1`` (the engine always emits a token) and
    ``prompt + output <= max_model_len`` (a longer request is cut to fit: the prompt keeps
    what the output leaves, as a client truncating its context would).

    The engine's features are part of the mix, because they change how many iterations a
    request needs and what each one computes (the one place both service models, the
    closed loop and the formula, take them from):

    * **prefix caching** (``prefix_hit_rate = h``, used when the profile enables prefix
      caching): the first ``prefix[i] = int(h·P)`` tokens of every prompt are one shared
      prefix (one system prompt for the whole workload); at steady state the cache serves
      its full blocks, ``cached[i] = min(⌊prefix/bs⌋, ⌊(P−1)/bs⌋)·bs`` tokens (the engine
      always computes the last prompt token), so ``prefill[i] = P − cached`` tokens are
      computed and the cached blocks are held once for all sequences;
    * **speculative decoding** (the profile's ``spec_tokens = k``, ``spec_acceptance``):
      the ``O − 1`` tokens after the first take ``steps[i]`` verification steps on average
      (:func:`~velvetrope.engine.speculative.steps_moments`, exact), with variance
      ``steps_var[i]``, proposing ``draft[i]`` draft tokens in all.  Without it
      ``steps = O − 1``, ``steps_var = draft = 0``.

    ``work[i]`` is the (mean) number of iterations request ``i`` is scheduled in:
    ``first[i] = ceil(prefill/B)`` prefill iterations (``B = max_num_batched_tokens``), the
    last of which emits the first token, then ``steps[i]`` decode iterations.
    ``kv_tokens[i]`` is the mean sum over its iterations of the KV tokens it attends to
    (``P`` per prefill, about ``P + O/2`` per decode step, plus its drafts; exact without
    speculation).  ``work_values`` / ``work_weights`` and ``prompt_values`` /
    ``prompt_weights`` are the distinct values of ``work`` and of ``prefill`` with their
    frequencies (what quantile computations iterate over).  ``clipped`` counts the pairs
    cut to fit.  An output of 0 (prompt-only work: embeddings, rerank) costs the prefill
    alone: its last prefill iteration ends it (counted as its one output token).  Arrays are
    read-only.
    """

    prompt: IntArray
    output: IntArray
    work: FloatArray
    first: FloatArray
    kv_tokens: FloatArray
    clipped: int
    work_values: FloatArray
    work_weights: FloatArray
    prompt_values: IntArray
    prompt_weights: FloatArray
    prefix_hit_rate: float
    prefix: IntArray
    cached: IntArray
    steps: FloatArray
    steps_var: FloatArray
    draft: FloatArray

    @classmethod
    def fit(
        cls,
        prompt: ArrayLike,
        output: ArrayLike,
        profile: EngineProfile,
        prefix_hit_rate: float = 0.0,
    ) -> LengthMix:
        """Fit raw ``prompt``/``output`` lengths (tokens) to ``profile``'s limits and
        features; ``prefix_hit_rate`` in ``[0, 1)`` (see the class docstring)."""
        p = np.asarray(prompt, dtype=np.int64)
        o = np.asarray(output, dtype=np.int64)
        if p.ndim != 1 or p.shape != o.shape or p.size == 0:
            raise PolicyError("prompt and output must be aligned, non-empty 1-D arrays")
        if int(p.min()) < 1 or int(o.min()) < 0:
            raise PolicyError("prompt lengths must be >= 1 and output lengths >= 0")
        h = float(prefix_hit_rate)
        if not 0.0 <= h < 1.0:
            raise PolicyError(f"prefix hit rate must be in [0, 1) (got {prefix_hit_rate!r})")
        cap = profile.max_model_len
        o2 = np.clip(o, 1, cap - 1)
        p2 = np.minimum(p, cap - o2)
        # an output of 0 is prompt-only work (embeddings, rerank): a prefill whose last
        # iteration ends it, modelled as its first token; that is no cut
        clipped = int(np.count_nonzero((p2 != p) | (o2 != np.maximum(o, 1))))
        bs = profile.block_size
        prefix = np.floor(h * p2.astype(np.float64)).astype(np.int64)
        if profile.enable_prefix_caching and h > 0:
            cached = np.minimum(prefix // bs, (p2 - 1) // bs) * bs
        else:
            cached = np.zeros_like(p2)
        prefill = p2 - cached
        first = np.ceil(prefill / profile.max_num_batched_tokens).astype(np.float64)
        pf = p2.astype(np.float64)
        of = o2.astype(np.float64)
        k = profile.spec_tokens
        if k:
            mean, second, drafts = steps_moments(int(o2.max()) - 1, k, profile.spec_acceptance)
            m1 = np.asarray(mean)[o2 - 1]
            steps = m1
            steps_var = np.maximum(np.asarray(second)[o2 - 1] - m1 * m1, 0.0)
            draft = np.asarray(drafts)[o2 - 1]
        else:
            steps = of - 1.0
            steps_var = np.zeros_like(of)
            draft = np.zeros_like(of)
        work = first + steps
        kv = first * pf + steps * (pf + of / 2.0) + draft
        wv, wc = np.unique(work, return_counts=True)
        pv, pc = np.unique(prefill, return_counts=True)
        ww = wc / float(work.size)
        pw = pc / float(p2.size)
        arrays = (p2, o2, work, first, kv, wv, ww, pv, pw, prefix, cached, steps, steps_var, draft)
        for a in arrays:
            a.setflags(write=False)
        return cls(p2, o2, work, first, kv, clipped, wv, ww, pv, pw, h, prefix, cached,
                   steps, steps_var, draft)  # fmt: skip

    def __len__(self) -> int:
        return int(self.prompt.size)

    @property
    def mean_work(self) -> float:
        """``E[w]``: mean iterations per request."""
        return float(self.work.mean())

    @property
    def work_scv(self) -> float:
        """``C_s²`` of the iterations per request (variance / mean²): the service-time SCV.

        The variance is over the mix plus, with speculative decoding, the mean variance of
        a request's own steps (how many drafts each step accepts is random)."""
        m = float(self.work.mean())
        within = float(self.steps_var.mean())
        return (float(self.work.var()) + within) / (m * m)

    @property
    def mean_tokens(self) -> float:
        """Mean prompt + output tokens per request after fitting."""
        return float(self.prompt.mean() + self.output.mean())


# --------------------------------------------------------------------------- the curve


def regularise_throughput(
    concurrency: Sequence[int] | IntArray, throughput: Sequence[float] | FloatArray
) -> FloatArray:
    """The least concave majorant of ``(0, 0), (n_i, X_i)`` at the ``n_i``, then made flat
    after its maximum (running max).  ``concurrency`` strictly increasing, ``X_i > 0``."""
    n = np.asarray(concurrency, dtype=np.float64)
    x = np.asarray(throughput, dtype=np.float64)
    if n.ndim != 1 or n.shape != x.shape or n.size == 0:
        raise PolicyError("concurrency and throughput must be aligned, non-empty 1-D arrays")
    if not bool(np.all(np.diff(n) > 0)) or n[0] <= 0:
        raise PolicyError("concurrency must be strictly increasing and > 0")
    if not bool(np.all(np.isfinite(x))) or not bool(np.all(x > 0)):
        raise PolicyError("throughput must be finite and > 0")
    pts = [(0.0, 0.0), *zip(n.tolist(), x.tolist(), strict=True)]
    hull: list[tuple[float, float]] = []
    for p in pts:  # upper hull, monotone chain
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    hx = np.array([h[0] for h in hull])
    hy = np.array([h[1] for h in hull])
    out = np.interp(n, hx, hy)
    return np.maximum.accumulate(np.maximum(out, x))


@dataclass(frozen=True, eq=False)
class ServiceCurve:
    """Throughput and residence versus concurrency for one engine and one length mix.

    ``concurrency`` is the grid; ``throughput_rps`` the regularised ``X(n)`` (req/s);
    ``raw_throughput_rps`` what was measured or computed before regularisation;
    ``step_s`` the mean iteration time at each ``n`` (s); ``preemptions_per_request``
    the preemptions per completed request (0 for the analytic method); ``mix`` the fitted
    length mix; ``method`` how it was obtained (``given``: :func:`curve_from_measurements`,
    whose step times and preemptions are unknown, ``nan``).  See the module docstring.
    """

    profile: EngineProfile
    mix: LengthMix
    method: Method
    concurrency: IntArray
    throughput_rps: FloatArray
    raw_throughput_rps: FloatArray
    step_s: FloatArray
    preemptions_per_request: FloatArray

    def __post_init__(self) -> None:
        for a in (
            self.concurrency,
            self.throughput_rps,
            self.raw_throughput_rps,
            self.step_s,
            self.preemptions_per_request,
        ):
            a.setflags(write=False)

    @property
    def max_concurrency(self) -> int:
        """The largest concurrency on the grid (the profile's ``max_num_seqs``)."""
        return int(self.concurrency[-1])

    @property
    def max_throughput_rps(self) -> float:
        """The saturated throughput ``max_n X(n)`` (req/s)."""
        return float(self.throughput_rps[-1])

    def throughput(self, n: float) -> float:
        """``X(n)`` in req/s at (real) concurrency ``n >= 0``; 0 at 0, flat past the grid."""
        v = float(n)
        if not (math.isfinite(v) and v >= 0):
            raise PolicyError(f"concurrency must be finite and >= 0 (got {n!r})")
        xs = np.concatenate(([0.0], self.concurrency.astype(np.float64)))
        ys = np.concatenate(([0.0], self.throughput_rps))
        return float(np.interp(v, xs, ys))

    def throughput_table(self, k: int) -> FloatArray:
        """``[X(0), X(1), …, X(k)]`` at the integers (req/s), for the queueing model."""
        xs = np.concatenate(([0.0], self.concurrency.astype(np.float64)))
        ys = np.concatenate(([0.0], self.throughput_rps))
        return np.interp(np.arange(k + 1, dtype=np.float64), xs, ys)

    def residence(self, n: float) -> float:
        """``R(n) = n/X(n)``: mean seconds a request spends in the engine at concurrency
        ``n > 0`` (``R(1)`` for ``n <= 1``)."""
        v = max(float(n), 1.0)
        return v / self.throughput(v)

    def knee(self, fraction: float = 0.95) -> int:
        """The smallest grid concurrency whose throughput reaches ``fraction`` of the max.

        Past it a replica gains under ``1 − fraction`` in throughput while every request's
        residence keeps growing, so the planner does not consider larger concurrencies
        unless told to.
        """
        f = float(fraction)
        if not 0 < f <= 1:
            raise PolicyError(f"fraction must be in (0, 1] (got {fraction!r})")
        target = f * self.max_throughput_rps
        idx = int(np.argmax(self.throughput_rps >= target * (1 - 1e-12)))
        return int(self.concurrency[idx])

    def per_iteration_s(self, n: float) -> float:
        """``τ(n) = R(n)/E[w]``: mean seconds per iteration a request experiences at ``n``."""
        return self.residence(n) / self.mix.mean_work


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


# --------------------------------------------------------------------------- mean field


@dataclass(frozen=True, slots=True)
class EffectiveService:
    """The operating point of one replica offered ``arrival_rps`` (mean-field).

    ``concurrency`` solves ``X(n) = λ``; ``service_s = R(n) = n/λ`` is the mean time a
    request spends in the engine there and ``mu_per_slot = 1/service_s`` the effective
    service rate of one of the ``n`` virtual servers.
    """

    arrival_rps: float
    concurrency: float
    service_s: float
    mu_per_slot: float
    utilisation: float


def effective_service(curve: ServiceCurve, arrival_rps: float) -> EffectiveService:
    """Where a replica settles when offered ``arrival_rps`` req/s (no queueing, mean field).

    The concurrency the load implies is the ``n`` with ``X(n) = λ`` (Little: ``n = λ·R(n)``),
    found by inverting the piecewise-linear, non-decreasing ``X``.  Since ``R`` grows with
    ``n``, ``mu_per_slot`` falls as ``λ`` rises: the seed's "effective μ falls as ρ rises".
    ``utilisation`` is ``λ / max X``.  Raises :class:`~velvetrope.errors.PolicyError` when
    ``λ >= max X`` (no stationary operating point: the engine's own queue grows).
    """
    lam = float(arrival_rps)
    if not (math.isfinite(lam) and lam > 0):
        raise PolicyError(f"arrival_rps must be finite and > 0 (got {arrival_rps!r})")
    xmax = curve.max_throughput_rps
    if lam >= xmax:
        raise PolicyError(
            f"{lam:g} req/s is at or beyond the replica's saturated throughput {xmax:g} req/s"
        )
    xs = np.concatenate(([0.0], curve.concurrency.astype(np.float64)))
    ys = np.concatenate(([0.0], curve.throughput_rps))
    i = int(np.searchsorted(ys, lam, side="left"))  # ys[i-1] < lam <= ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    n = float(x0 + (x1 - x0) * (lam - y0) / (y1 - y0))
    s = n / lam
    return EffectiveService(lam, n, s, 1.0 / s, lam / xmax)
