"""Latency of a fleet of batching replicas behind one admission queue: the queueing model.

The system modelled
-------------------
``N`` identical replicas sit behind the gateway.  Each runs at most ``K`` requests at once
(the admission core's slots: ``max_in_flight = N·K`` for the pool); a request that finds
all ``N·K`` slots busy waits in the gateway's FCFS queue and is dispatched to the
least-loaded replica when a slot frees.  Arrivals at rate ``λ`` are a renewal process with
inter-arrival SCV ``C_a²``.

The model (assumptions stated)
------------------------------
1. **Each replica is a load-dependent server** (:mod:`velvetrope.planner.service`): with
   ``n`` requests it completes them at ``X(n)`` req/s, i.e. ``n`` virtual servers each at
   rate ``1/R(n)``.
2. **Least-loaded dispatch spreads the ``j`` requests in service as evenly as possible**:
   ``q = j // N`` on every replica and one more on ``r = j % N`` of them, so the fleet
   completes ``d(j) = (N − r)·X(q) + r·X(q + 1)`` req/s; with ``j >= N·K`` every slot is
   busy and ``d = N·X(K)``.
3. **Completions are memoryless at the fleet level**, which makes the number in system
   ``j`` a birth–death process with birth rate ``λ`` and death rate ``d(j)``, solved
   exactly: ``π_j ∝ Π_{i<=j} λ/d(i)`` with a geometric tail of ratio
   ``r = λ/(N·X(K))`` beyond ``N·K``.  (The departures of ``N·K`` concurrent requests are
   a superposition of many slot processes, close to Poisson by the Palm–Khintchine
   theorem; the simulator checks how close.)  With ``X(n) = n·μ`` this is exactly M/M/c
   with ``c = N·K`` and Erlang C (:func:`velvetrope.planner.queueing.erlang_c`).
4. **Wait, given the arrivals** (``arrival_pattern``, what the planner uses for every
   trace and workload file): the ``N·K`` slots are a G/D/c queue in which every request
   holds its slot for ``R(K) = K/X(K)``, the residence at full concurrency (a request
   waits only while every slot is busy), replayed on the pattern's arrivals scaled to
   ``λ``: :func:`velvetrope.planner.queueing_general.gdc_waits`, exact for G/D/c and
   O(arrivals).  The wait's distribution is the empirical one of those waits.  A constant
   service time is not a guess at the engine: under continuous batching a busy slot turns
   over every ``R(K)`` on average, and a burst that fills the slots with fresh requests is
   not served faster by the short ones among them, which a memoryless or
   per-request-length model assumes; against the simulator this recursion is the closest
   of the forms tried (see the accuracy list below).
   **Without a pattern** (Poisson arrivals, or a caller's ``arrival_scv``): by PASTA an
   arrival waits iff ``j >= N·K``: ``π_wait = P(j >= N·K)``.  In the birth–death model
   the wait given waiting is exponential with rate ``N·X(K) − λ``; it is scaled by the
   Allen–Cunneen factor ``(C_a² + C_s²)/2`` for non-Poisson arrivals and non-exponential
   service, exactly as :func:`velvetrope.planner.queueing_general.ggc_wait_tail` does for
   G/G/c (which this reduces to when ``X(n) = n·μ``):
   ``P(W > t) ≈ π_wait·exp(−t·π_wait/E[W])``.
   ``C_s²`` is the SCV of the iterations per request.  This keeps the Poisson probability
   of waiting, so it is optimistic for bursty arrivals.
5. **Service.** The mean time in service follows from Little's law on the slots:
   ``E[S] = E[min(j, N·K)]/λ``; request ``i`` takes ``S_i = w_i·E[S]/E[w]`` (its
   iterations times the mean iteration time at that load).  Because ``R(n)`` grows with
   ``n``, ``E[S]`` — and so every request's service — grows with the load: the convoy
   effect.  A request that waited (with an arrival pattern) starts in a burst, with every
   slot busy, and the burst drains while it runs: its iterations take ``τ_w = (τ + τ(K))/2``,
   halfway between the design load's and full concurrency's ``τ(K) = R(K)/E[w]``
   (measured: with ``τ`` alone the code trace's p99 end-to-end came out 48 % low, with
   ``τ(K)`` up to 26 % high; see the accuracy list).
   A request that did not wait still arrived when others did: it runs at the iteration
   time of the concurrency it finds (counted on the replayed arrivals, each request in
   service for ``E[S]``, spread over the replicas; :func:`_seen_iterations`), not at the
   time-average ``τ``: in a bursty trace that is most of the gap between the two.
   End-to-end ``= W + S_i`` with ``W`` independent of the request's size (FCFS);
   time to first token ``≈ W + R + f_i·τ + pf·P_i``: the residual ``R`` of the iteration in
   progress at dispatch (work added during an iteration waits for the next one; long
   when another request's prefill is running, see :func:`_residual_step`), then ``f_i``
   prefill iterations of mean length ``τ`` plus the request's own prefill compute.
   With multi-step scheduling (a ``vllm-v0`` profile's ``num_scheduler_steps = k > 1``)
   a request dispatched to a busy replica also waits for the next admission window:
   ``U·τ`` more, ``U`` uniform on ``0 .. k−1`` (the iterations left in the window).
6. **Quantiles** of end-to-end and TTFT average the wait's tail over the length mix:
   ``P(W + S > t) = mean_i P(W > t − S_i)``, inverted by bisection.

Accuracy, measured against the simulator (``velvetrope plan ... --verify``: the workload's
arrival pattern at the design rate, the real admission core and batchers, 20,000 requests;
``llama3-8b-h100`` unless named):

* code trace (bursty: ``C_a²`` 51 inside minutes, 173 over the whole trace), default plan
  (``velvetrope plan --trace azure_code --verify``: 2 replicas × 64 slots): p99 wait
  −20.3 % at 2 replicas, −6.4 % at 1; p99 TTFT −28.8 % and −6.6 %; p99 end-to-end −7.6 %
  and −0.9 % (−27.0 % at 2 replicas with every request that did not wait at ``τ``; a
  Poisson-wait model predicts a p99 wait of 0 s here);
* conversation trace, 50 req/s, ``--slo-metric e2e --slo-p99 10s``: p99 end-to-end +4.0 %
  at 5 replicas, +5.4 % at 4; p99 TTFT −12 % and −16 %; no wait in either;
* the issue's example (``llama3-70b-4xh100``, conversation trace, 50 req/s): p99 end-to-end
  +1.9 % at 10 replicas, +4.0 % at 9; p99 TTFT −8 % and −11 %;
* ``bench/planner_validate.py`` (both traces, at the design point and replayed whole,
  minute by minute): conversation p99 end-to-end within 4.8 %; code p99 wait within 16 %,
  TTFT within 19 %, end-to-end 9–18 % low (``code_err`` 0.186; 0.288 with every request
  that did not wait at ``τ``);
* p99 TTFT is the other weak spot: 8–27 % low on the conversation trace (the plans above
  and ``--trace azure_conv --verify``, ``--tier batch --slo-p99 2s --peak-rps 40``).

The plan names the last two where they apply
(:func:`velvetrope.planner.sizing.plan_warnings`).

:func:`predict` evaluates one stationary operating point, a
:class:`~velvetrope.planner.prediction.Prediction`.
:func:`~velvetrope.planner.prediction.mixture_quantile` combines several (one per minute of
a trace, say), weighting each by its arrivals: the quasi-stationary approximation for a rate
that varies slowly compared with how fast the queue relaxes.

Units: seconds, requests per second.  An overloaded fleet (``λ >= N·X(K)``) has no
stationary latency: :func:`predict` then returns ``stable=False`` with infinite latencies.
Bad arguments raise :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from velvetrope.errors import PolicyError
from velvetrope.planner.prediction import Prediction
from velvetrope.planner.queueing_general import gdc_waits
from velvetrope.planner.service import ServiceCurve

__all__ = ["fleet_departure_rates", "predict"]

FloatArray = NDArray[np.float64]


def fleet_departure_rates(x_table: FloatArray, replicas: int) -> FloatArray:
    """``d(j)`` for ``j = 0 … N·K`` (req/s) from ``x_table = [X(0), …, X(K)]``.

    ``d(j) = (N − r)·X(q) + r·X(q + 1)`` with ``q = j // N``, ``r = j % N`` (assumption 2).
    """
    k = len(x_table) - 1
    n = replicas
    j = np.arange(n * k + 1)
    q, r = np.divmod(j, n)
    padded = np.concatenate((x_table, [x_table[-1]]))
    return np.asarray((n - r) * padded[q] + r * padded[np.minimum(q + 1, k + 1)], dtype=np.float64)


_RESIDUAL_POINTS = 16


def _residual_step(
    tau: float,
    lam_replica: float,
    pf: float,
    prompts: FloatArray | NDArray[np.int64],
    weights: FloatArray,
    p_busy: float,
) -> tuple[FloatArray, FloatArray]:
    """The residual of the iteration in progress when a request is dispatched (assumption 5).

    A replica's iterations are decode-only (``τ0 = τ·(1 − f)``, ``f = λ_r·pf·E[P]`` the
    fraction of its time spent on prefill compute) or also carry one arriving request's
    prefill (``τ0 + pf·P_j``, at rate ``λ_r``).  A request dispatched at a random instant
    of a busy replica waits out the iteration in progress (vLLM schedules at the start of an
    iteration): the time-stationary residual life ``P(R > r) = Σ_k ν_k (T_k − r)⁺ / Σ_k ν_k
    T_k``, stretched by ``1 + f`` for the prefills of the requests dispatched to the same
    replica while it waits, which join its iteration.  Returned as ``_RESIDUAL_POINTS``
    equal-probability points (bin midpoints) with weights; the idle share ``1 − p_busy``
    sits at 0.
    """
    e_p = float(np.dot(weights, prompts))
    f = min(lam_replica * pf * e_p, 0.95)
    t0 = tau * (1.0 - f)
    m = (1.0 - f) / t0  # decode-only iterations per second of busy time
    lengths = np.concatenate(([t0], t0 + pf * np.asarray(prompts, dtype=np.float64)))
    rates = np.concatenate(([m], lam_replica * weights))
    total = float(np.dot(rates, lengths))
    order = np.argsort(lengths)
    ls, rs = lengths[order], rates[order]
    # P(R > r) is piecewise linear with knots at the step lengths: evaluate there, invert.
    knots = np.concatenate(([0.0], ls))
    idx = np.searchsorted(ls, knots, side="right")
    suffix_a = np.concatenate((np.cumsum((rs * ls)[::-1])[::-1], [0.0]))
    suffix_b = np.concatenate((np.cumsum(rs[::-1])[::-1], [0.0]))
    above = np.maximum(suffix_a[idx] - knots * suffix_b[idx], 0.0) / total
    u = (np.arange(_RESIDUAL_POINTS) + 0.5) / _RESIDUAL_POINTS  # P(R > r) targets
    values = np.interp(-u, -above, knots)  # `above` is decreasing in r
    pb = min(max(p_busy, 0.0), 1.0)
    # Requests dispatched to the replica during the same residual join the same iteration
    # and add their prefills to it: on average λ_r·R·pf·E[P] = f·R more.
    out_v = np.concatenate(([0.0], values * (1.0 + f)))
    out_w = np.concatenate(([1.0 - pb], np.full(_RESIDUAL_POINTS, pb / _RESIDUAL_POINTS)))
    return out_v, out_w


def predict(
    curve: ServiceCurve,
    arrival_rps: float,
    replicas: int,
    concurrency: int,
    *,
    arrival_scv: float = 1.0,
    arrival_pattern: FloatArray | None = None,
) -> Prediction:
    """The model's latency for ``replicas`` replicas at ``concurrency`` slots each.

    ``arrival_rps`` > 0 is λ; ``arrival_scv`` is ``C_a²`` (1 for Poisson), used only without
    a pattern.  ``arrival_pattern``: sorted arrival times at a mean rate of 1 req/s
    (:attr:`velvetrope.planner.workload.PlanWorkload.arrival_pattern`), replayed at λ for the
    wait (assumption 4).  See the module docstring for the model.  Cost O(N·K + arrivals)
    here, O(distinct lengths × log arrivals) per quantile.
    """
    lam = float(arrival_rps)
    if not (math.isfinite(lam) and lam > 0):
        raise PolicyError(f"arrival_rps must be finite and > 0 (got {arrival_rps!r})")
    for name, v in (("replicas", replicas), ("concurrency", concurrency)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PolicyError(f"{name} must be an int >= 1 (got {v!r})")
    ca2 = float(arrival_scv)
    if not (math.isfinite(ca2) and ca2 >= 0):
        raise PolicyError(f"arrival_scv must be finite and >= 0 (got {arrival_scv!r})")
    n, k = replicas, concurrency
    mix = curve.mix
    table = curve.throughput_table(k)
    full = n * float(table[k])
    rho = lam / full
    variability = (ca2 + mix.work_scv) / 2.0
    if rho >= 1.0:
        inf = math.inf
        return Prediction(
            lam, n, k, rho, False, 1.0, float(k), inf, 0.0, inf, inf, inf,
            mix.work_values, mix.work_weights, mix.work_values, mix.work_weights,
        )  # fmt: skip
    c = n * k
    d = fleet_departure_rates(table, n)  # d[0] = 0
    log_terms = np.concatenate(([0.0], np.cumsum(math.log(lam) - np.log(d[1:]))))
    body = np.exp(log_terms - float(log_terms.max()))
    tail_mass = body[c] * rho / (1.0 - rho)  # states c+1, c+2, … (geometric)
    z = float(body.sum()) + tail_mass
    p_queue = float((body[c] + tail_mass) / z)  # P(j >= c): an arrival waits (PASTA)
    busy = (float(np.dot(np.arange(c), body[:c])) + c * float(body[c] + tail_mass)) / z
    wait_mean = variability * p_queue / (full - lam)
    service_mean = busy / lam
    tau = service_mean / mix.mean_work
    p_idle = float(body[:n].sum()) / z  # fewer than N in service: some replica is idle
    first, first_w = _first_token(curve, tau, lam / n, 1.0 - p_idle)
    e2e_mean = wait_mean + service_mean
    sample = waited_service = waited_first = np.zeros(0)
    service_values, service_weights = mix.work_values * tau, mix.work_weights
    if arrival_pattern is not None:
        r_k = k / float(table[k])  # R(K): a slot's turnover with every slot busy
        arrivals = np.asarray(arrival_pattern, dtype=np.float64) / lam
        waits = gdc_waits(arrivals, c, r_k)
        sample = np.sort(waits)
        sample.setflags(write=False)
        p_queue = float(np.count_nonzero(sample)) / sample.size
        wait_mean = float(sample.mean())
        tau_w = 0.5 * (tau + r_k / mix.mean_work)
        taus, tau_weights = _seen_iterations(curve, arrivals, waits, service_mean, n)
        service_values = (mix.work_values[:, None] * taus[None, :]).ravel()
        service_weights = (mix.work_weights[:, None] * tau_weights[None, :]).ravel()
        waited_service = np.repeat(mix.work_values * tau_w, taus.size)
        waited_first, _ = _first_token(curve, tau_w, lam / n, 1.0)
        seen = float(np.dot(taus, tau_weights))
        e2e_mean = wait_mean + service_mean * ((1.0 - p_queue) * seen / tau + p_queue * tau_w / tau)
    return Prediction(
        arrival_rps=lam,
        replicas=n,
        concurrency=k,
        rho=rho,
        stable=True,
        p_wait=p_queue,
        mean_concurrency=busy / n,
        service_mean_s=service_mean,
        mu_per_slot=1.0 / service_mean,
        per_iteration_s=tau,
        wait_mean_s=wait_mean,
        e2e_mean_s=e2e_mean,
        service_values=service_values,
        service_weights=service_weights,
        first_values=first,
        first_weights=first_w,
        wait_sample=sample,
        waited_service_values=waited_service,
        waited_first_values=waited_first,
    )


_SEEN_POINTS = 16


def _seen_iterations(
    curve: ServiceCurve, arrivals: FloatArray, waits: FloatArray, service: float, replicas: int
) -> tuple[FloatArray, FloatArray]:
    """The mean iteration time each request that did not wait runs at (values, weights).

    Arrivals cluster: a request that starts at once in a burst shares its replica with the
    burst, so it runs at the iteration time of the concurrency it finds, not at the
    time-average ``τ``.  The concurrency is counted on the replayed arrivals (each request in
    service for the mean service time from its start), spread evenly over the replicas
    (assumption 2), itself included; ``τ(m) = R(m)/E[w]``.  Returned as
    ``_SEEN_POINTS`` equal-probability points (bin midpoints).
    """
    free = waits == 0.0
    starts = np.sort(arrivals + waits)
    ends = np.sort(starts + service)
    at = arrivals[free] if bool(free.any()) else arrivals
    busy = np.searchsorted(starts, at, side="right") - np.searchsorted(ends, at, side="right")
    per = np.maximum(busy / float(replicas), 1.0)
    xs = np.concatenate(([0.0], curve.concurrency.astype(np.float64)))
    ys = np.concatenate(([0.0], curve.throughput_rps))
    taus = per / np.interp(per, xs, ys) / curve.mix.mean_work
    u = (np.arange(_SEEN_POINTS) + 0.5) / _SEEN_POINTS
    values: FloatArray = np.quantile(taus, u)
    return values, np.full(_SEEN_POINTS, 1.0 / _SEEN_POINTS)


def _first_token(
    curve: ServiceCurve, tau: float, lam_replica: float, p_busy: float
) -> tuple[FloatArray, FloatArray]:
    """Time from dispatch to first token (values, weights) at mean iteration time ``tau``:
    the residual of the iteration in progress, then the request's own prefill (assumption 5)."""
    prof = curve.profile
    mix = curve.mix
    pv = mix.prompt_values
    own = np.ceil(pv / prof.max_num_batched_tokens) * tau + prof.per_prefill_token_s * pv
    res_v, res_w = _residual_step(
        tau, lam_replica, prof.per_prefill_token_s, pv, mix.prompt_weights, p_busy
    )
    k = prof.num_scheduler_steps
    if k > 1:  # busy: the rest of the admission window too (res_v[0] is the idle share)
        busy_v = (res_v[1:, None] + tau * np.arange(k)[None, :]).ravel()
        res_v = np.concatenate((res_v[:1], busy_v))
        res_w = np.concatenate((res_w[:1], np.repeat(res_w[1:] / k, k)))
    first = (own[:, None] + res_v[None, :]).ravel()
    first_w = (mix.prompt_weights[:, None] * res_w[None, :]).ravel()
    return first, first_w
