"""Closed-form queueing formulas with general arrivals or service, for capacity planning.

M/G/1 (Pollaczek–Khinchine, with its exponential tail), the non-preemptive priority M/G/1
queue (Cobham), shortest-job-first on M/G/1 (Phipps), G/G/1 (Kingman), G/G/c
(Allen–Cunneen) and the trace-driven G/D/c recursion.  Units, the meaning of wait and
response, and the errors follow the conventions of :mod:`velvetrope.planner.queueing`
(which holds Little's law and the Markovian queues these reduce to); every function is
pure and validates its inputs (:mod:`velvetrope.planner.queueing_checks`).

Sources: Pollaczek (1930) and Khinchine (1932); Cobham (1954); Phipps (1956); Kleinrock
(1965, conservation law); Kingman (1961); Allen (1990) for the Allen–Cunneen
approximation; Kiefer & Wolfowitz (1955) for the multi-server recursion of
:func:`gdc_waits`.  Textbook derivations of all of them are in L. Kleinrock, *Queueing
Systems*, Vols. 1–2 (1975–76).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from velvetrope.errors import PolicyError
from velvetrope.planner.queueing import (
    erlang_c,
    exponential_wait_quantile,
    exponential_wait_tail,
    mmc_wait_mean,
)
from velvetrope.planner.queueing_checks import (
    mm_rates,
    nonnegative,
    positive,
    second_moment,
    servers,
    stable,
)

__all__ = [
    "SJFWaits",
    "gdc_waits",
    "gg1_wait_mean",
    "ggc_wait_mean",
    "ggc_wait_quantile",
    "ggc_wait_tail",
    "mg1_priority_wait_means",
    "mg1_response_mean",
    "mg1_sjf_waits",
    "mg1_wait_mean",
    "mg1_wait_mean_cs2",
    "mg1_wait_quantile",
    "mg1_wait_tail",
]


# --------------------------------------------------------------------------- validation


def _mg1_rates(lam: float, es: float, es2: float) -> tuple[float, float, float, float]:
    """Validate an M/G/1 parameter set; return (lam, es, es2, rho)."""
    lam_v = positive("lam", lam)
    es_v = positive("es", es)
    es2_v = second_moment("es2", es2, es_v)
    rho = lam_v * es_v
    stable(rho, f"lam*es with lam={lam_v!r}, es={es_v!r}")
    return lam_v, es_v, es2_v, rho


# --------------------------------------------------------------------------- M/G/1


def mg1_wait_mean(lam: float, es: float, es2: float) -> float:
    """Pollaczek–Khinchine mean wait of M/G/1: ``Wq = λ·E[S²]/(2·(1 − ρ))``, ρ = λ·E[S].

    Model: Poisson arrivals at rate ``lam``, i.i.d. service times with mean ``es`` and
    second moment ``es2`` (>= es²), one server, any non-preemptive discipline that does
    not look at service times (FCFS, random, LCFS), ρ < 1.  Source: Pollaczek (1930),
    Khinchine (1932).  ``λ·E[S²]/2`` is the mean residual work W0 an arrival finds in
    service.
    """
    lam_v, _, es2_v, rho = _mg1_rates(lam, es, es2)
    return lam_v * es2_v / (2.0 * (1.0 - rho))


def mg1_wait_mean_cs2(lam: float, es: float, cs2: float) -> float:
    """Pollaczek–Khinchine in its ``C_s²`` form: ``Wq = ρ·E[S]·(1 + C_s²)/(2·(1 − ρ))``.

    Same model and source as :func:`mg1_wait_mean` with ``E[S²] = E[S]²·(1 + C_s²)``;
    ``cs2`` >= 0 (1 for exponential service: M/M/1; 0 for constant service: M/D/1).
    """
    es_v = positive("es", es)
    return mg1_wait_mean(lam, es_v, es_v * es_v * (1.0 + nonnegative("cs2", cs2)))


def mg1_response_mean(lam: float, es: float, es2: float) -> float:
    """Mean response time of M/G/1: ``W = Wq + E[S]`` with Wq from :func:`mg1_wait_mean`."""
    return mg1_wait_mean(lam, es, es2) + positive("es", es)


def mg1_wait_tail(lam: float, es: float, es2: float, t: float) -> float:
    """Approximate ``P(Wq > t)`` for M/G/1 FCFS with the exponential approximation.

    Uses :func:`~velvetrope.planner.queueing.exponential_wait_tail` with the exact
    ``P(Wq > 0) = ρ`` (PASTA: an arrival waits iff the server is busy) and the exact
    Pollaczek–Khinchine mean.  Exact for M/M/1.  Against Erlang's exact M/D/1 wait
    distribution (1909) the approximate p99 is too high by 28 % at ρ = 0.3, 17 % at 0.5,
    6 % at 0.8, 3 % at 0.9 and 1.3 % at 0.95, while the median at ρ = 0.8 is 8 % too low
    (measured in the tests): best in heavy traffic, conservative in the upper tail of M/D/1.
    """
    _, _, _, rho = _mg1_rates(lam, es, es2)
    return exponential_wait_tail(rho, mg1_wait_mean(lam, es, es2), t)


def mg1_wait_quantile(lam: float, es: float, es2: float, p: float) -> float:
    """The ``p``-quantile of the M/G/1 wait under :func:`mg1_wait_tail`'s approximation."""
    _, _, _, rho = _mg1_rates(lam, es, es2)
    return exponential_wait_quantile(rho, mg1_wait_mean(lam, es, es2), p)


def mg1_priority_wait_means(
    lams: Sequence[float], es: Sequence[float], es2: Sequence[float]
) -> tuple[float, ...]:
    """Per-class mean waits of the non-preemptive priority M/G/1 queue (Cobham 1954).

    ``W_k = W0/((1 − σ_{k−1})·(1 − σ_k))`` with ``W0 = Σ_i λ_i·E[S_i²]/2`` (mean residual
    work in service), ``σ_k = Σ_{i<=k} λ_i·E[S_i]`` and σ_0 = 0.

    Model: class ``k`` (index 0 = highest priority) arrives as an independent Poisson
    stream at rate ``lams[k]`` >= 0 with service mean ``es[k]`` > 0 and second moment
    ``es2[k]`` >= es[k]²; one server; a job in service is never interrupted; FCFS inside a
    class.  Requires the total load ``σ_K < 1`` (PolicyError otherwise, even though the
    higher classes alone might be stable).  Returns one mean wait (time units) per class,
    in input order.  Source: A. Cobham, "Priority assignment in waiting line problems",
    Operations Research 2 (1954).
    """
    k = len(lams)
    if k == 0:
        raise PolicyError("lams must name at least one class")
    if len(es) != k or len(es2) != k:
        raise PolicyError(
            f"lams, es and es2 must have the same length (got {k}, {len(es)}, {len(es2)})"
        )
    rates = [nonnegative(f"lams[{i}]", x) for i, x in enumerate(lams)]
    means = [positive(f"es[{i}]", x) for i, x in enumerate(es)]
    m2 = [second_moment(f"es2[{i}]", x, means[i]) for i, x in enumerate(es2)]
    sigmas = list(itertools.accumulate(r * s for r, s in zip(rates, means, strict=True)))
    stable(sigmas[-1], "sum(lams[k]*es[k])")
    w0 = math.fsum(r * s2 for r, s2 in zip(rates, m2, strict=True)) / 2.0
    return tuple(
        w0 / ((1.0 - below) * (1.0 - through))
        for below, through in zip([0.0, *sigmas[:-1]], sigmas, strict=True)
    )


@dataclass(frozen=True, eq=False)
class SJFWaits:
    """Mean waits of non-preemptive shortest-job-first on M/G/1 (Phipps 1956).

    Produced by :func:`mg1_sjf_waits` for an empirical size distribution.  Arrays are
    read-only, aligned and indexed by distinct size, ascending.

    Attributes:
        lam: total arrival rate.
        sizes: the distinct service times ``x_j`` (time units), ascending.
        probs: the fraction of jobs with size ``x_j``.
        load_below: ``ρ(x_j⁻)``, the load of jobs strictly shorter than ``x_j``.
        load_through: ``ρ(x_j)``, the load of jobs of size ``<= x_j``.
        waits: mean wait of a job of size ``x_j``.
        residual_work: ``W0 = λ·E[S²]/2``.
        rho: total utilisation ``λ·E[S]``.
        wait_mean: mean wait over all jobs, ``Σ_j probs[j]·waits[j]``.
        fcfs_wait_mean: the Pollaczek–Khinchine FCFS mean wait ``W0/(1 − ρ)`` of the same
            workload, for comparison (SJF's mean is never larger).
    """

    lam: float
    sizes: npt.NDArray[np.float64]
    probs: npt.NDArray[np.float64]
    load_below: npt.NDArray[np.float64]
    load_through: npt.NDArray[np.float64]
    waits: npt.NDArray[np.float64]
    residual_work: float
    rho: float
    wait_mean: float
    fcfs_wait_mean: float

    def wait_for_size(self, x: float) -> float:
        """Mean wait of a (tagged) job of service time ``x`` > 0 under the same SJF queue.

        ``W0/((1 − ρ(x⁻))·(1 − ρ(x)))``; equal to ``waits[j]`` when ``x == sizes[j]``.
        Sizes between the support points see only the load of the shorter jobs.
        """
        v = positive("x", x)
        lo = int(np.searchsorted(self.sizes, v, side="left"))
        hi = int(np.searchsorted(self.sizes, v, side="right"))
        below = float(self.load_through[lo - 1]) if lo > 0 else 0.0
        through = float(self.load_through[hi - 1]) if hi > 0 else 0.0
        return self.residual_work / ((1.0 - below) * (1.0 - through))


def mg1_sjf_waits(lam: float, sizes: npt.ArrayLike) -> SJFWaits:
    """Non-preemptive SJF on M/G/1 for the empirical distribution of ``sizes`` (Phipps 1956).

    A job of size ``x`` waits on average ``W(x) = W0/((1 − ρ(x⁻))·(1 − ρ(x)))`` where
    ``ρ(x) = λ·∫_0^x t dF(t)`` is the load of jobs no longer than ``x``, ``ρ(x⁻)`` that of
    jobs strictly shorter, and ``W0 = λ·E[S²]/2``.  This is Cobham's priority formula
    (:func:`mg1_priority_wait_means`) with one class per distinct size.

    Model: Poisson arrivals at total rate ``lam``; each job's service time is drawn from
    the empirical distribution of ``sizes`` (a 1-D array of service times > 0 in time
    units, each sample weighted 1/n) and known to the scheduler; one server; the shortest
    waiting job starts whenever the server frees; no preemption.  **Ties**: jobs of equal
    size are served FCFS among themselves, so ``ρ(x⁻)`` excludes size ``x`` and ``ρ(x)``
    includes it.  Requires ρ = λ·mean(sizes) < 1.  The result is exact for that
    distribution.  Source: T. E. Phipps, "Machine repair as a priority waiting-line
    problem", Operations Research 4 (1956); the mean-wait ordering against FCFS follows
    from Kleinrock's conservation law (1965).
    """
    lam_v = positive("lam", lam)
    arr = np.asarray(sizes, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise PolicyError(f"sizes must be a non-empty 1-D array (got shape {arr.shape})")
    if not bool(np.all(np.isfinite(arr))) or not bool(np.all(arr > 0.0)):
        raise PolicyError("sizes must all be finite and > 0")
    values, counts = np.unique(arr, return_counts=True)
    probs = counts / float(arr.size)
    loads = lam_v * probs * values
    load_through = np.cumsum(loads)
    load_below = np.concatenate(([0.0], load_through[:-1]))
    rho = float(load_through[-1])
    stable(rho, f"lam*mean(sizes) with lam={lam_v!r}")
    w0 = lam_v * float(np.dot(probs, values * values)) / 2.0
    waits = w0 / ((1.0 - load_below) * (1.0 - load_through))
    for a in (values, probs, load_below, load_through, waits):
        a.setflags(write=False)
    return SJFWaits(
        lam=lam_v,
        sizes=values,
        probs=probs,
        load_below=load_below,
        load_through=load_through,
        waits=waits,
        residual_work=w0,
        rho=rho,
        wait_mean=float(np.dot(probs, waits)),
        fcfs_wait_mean=w0 / (1.0 - rho),
    )


# --------------------------------------------------------------------------- G/G/1, G/G/c


def gg1_wait_mean(lam: float, es: float, ca2: float, cs2: float) -> float:
    """Kingman's approximation for G/G/1: ``Wq ≈ (ρ/(1 − ρ))·((C_a² + C_s²)/2)·E[S]``.

    Model: renewal arrivals at rate ``lam`` with inter-arrival SCV ``ca2`` >= 0, i.i.d.
    service with mean ``es`` and SCV ``cs2`` >= 0, one server, FCFS, ρ = λ·E[S] < 1.
    Exact for M/M/1 and for M/G/1 when ``ca2 = 1``; asymptotically exact as ρ → 1 (heavy
    traffic).  Source:
    J. F. C. Kingman, "The single server queue in heavy traffic", Proc. Cambridge Phil.
    Soc. 57 (1961).
    """
    lam_v = positive("lam", lam)
    es_v = positive("es", es)
    v = (nonnegative("ca2", ca2) + nonnegative("cs2", cs2)) / 2.0
    rho = stable(lam_v * es_v, f"lam*es with lam={lam_v!r}, es={es_v!r}")
    return rho / (1.0 - rho) * v * es_v


def ggc_wait_mean(lam: float, mu: float, c: int, ca2: float, cs2: float) -> float:
    """Allen–Cunneen approximation for G/G/c: ``Wq ≈ (C(c, a)/(c·μ − λ))·((C_a² + C_s²)/2)``.

    The exact M/M/c wait (:func:`~velvetrope.planner.queueing.mmc_wait_mean`) scaled by
    the variability factor.  Model: renewal arrivals at rate ``lam`` (SCV ``ca2`` >= 0),
    ``c`` servers each with i.i.d. service at rate ``mu`` (SCV ``cs2`` >= 0), FCFS,
    ρ = λ/(cμ) < 1.  Exact for M/M/c; reduces to Kingman (:func:`gg1_wait_mean`) at c = 1.
    Source: A. O. Allen, *Probability, Statistics, and Queueing Theory* (2nd ed., 1990),
    crediting Allen and Cunneen.
    """
    v = (nonnegative("ca2", ca2) + nonnegative("cs2", cs2)) / 2.0
    return mmc_wait_mean(lam, mu, c) * v


def _ggc_wait_params(lam: float, mu: float, c: int, ca2: float, cs2: float) -> tuple[float, float]:
    _, _, n, a = mm_rates(lam, mu, c)
    return erlang_c(n, a), ggc_wait_mean(lam, mu, c, ca2, cs2)


def ggc_wait_tail(lam: float, mu: float, c: int, ca2: float, cs2: float, t: float) -> float:
    """Approximate ``P(Wq > t)`` for G/G/c with the exponential approximation.

    :func:`~velvetrope.planner.queueing.exponential_wait_tail` with ``P(Wq > 0) ≈ C(c, a)``
    (Erlang C at the same load) and the Allen–Cunneen mean (:func:`ggc_wait_mean`), i.e.
    ``P(Wq > t) ≈ C·exp(−t·(c·μ − λ)·2/(C_a² + C_s²))``.  Exact for M/M/c.  Parameters
    as in :func:`ggc_wait_mean`; ``t`` >= 0.
    """
    pw, wq = _ggc_wait_params(lam, mu, c, ca2, cs2)
    return exponential_wait_tail(pw, wq, t)


def ggc_wait_quantile(lam: float, mu: float, c: int, ca2: float, cs2: float, p: float) -> float:
    """The ``p``-quantile of the G/G/c wait under :func:`ggc_wait_tail`'s approximation."""
    pw, wq = _ggc_wait_params(lam, mu, c, ca2, cs2)
    return exponential_wait_quantile(pw, wq, p)


# --------------------------------------------------------------------------- G/D/c, trace-driven


_ROUNDING = 1e-9


def gdc_waits(arrivals: npt.ArrayLike, c: int, service: float) -> npt.NDArray[np.float64]:
    """Each arrival's wait in a FCFS queue with ``c`` servers and a constant service time.

    ``arrivals`` are arrival times (sorted, any origin, time units); ``service`` > 0 is the
    time every job holds its server.  The system starts empty.  Returns the waits, aligned
    with ``arrivals``.

    With equal service times and FCFS, jobs leave in the order they start, so job ``n``
    starts when it arrives or when job ``n − c`` leaves, whichever is later:
    ``s_n = max(a_n, s_{n−c} + service)`` (the Kiefer–Wolfowitz recursion, J. Kiefer and
    J. Wolfowitz, "On the theory of queues with many servers", Trans. AMS 78, 1955, for
    equal service times).  Along each residue class ``n ≡ r (mod c)`` this is Lindley's
    recursion with a constant drain, solved in closed form (Reich's formula):
    ``s_{r+mc} = m·service + max_{i<=m}(a_{r+ic} − i·service)``, a running maximum, so the
    whole computation is a few vectorised passes, O(len(arrivals)).

    Exact for G/D/c and for any arrival sequence (measured or synthetic); no stationarity
    is assumed, so a trace's bursts are taken as they came.  Waits below ``1e-9 × service``
    are rounding in the running maximum and returned as exactly 0.
    """
    n_servers = servers(c)
    s = positive("service", service)
    a = np.asarray(arrivals, dtype=np.float64)
    if a.ndim != 1:
        raise PolicyError(f"arrivals must be a 1-D array (got shape {a.shape})")
    if a.size == 0:
        return np.zeros(0)
    if not bool(np.all(np.isfinite(a))) or bool(np.any(np.diff(a) < 0)):
        raise PolicyError("arrivals must be finite and sorted")
    rows = -(-a.size // n_servers)
    pad = rows * n_servers - a.size
    grid = np.concatenate((a, np.full(pad, a[-1]))).reshape(
        rows, n_servers
    )  # padding is cut off below
    shift = (np.arange(rows, dtype=np.float64) * s)[:, None]
    start = np.maximum.accumulate(grid - shift, axis=0) + shift
    waits = (start - grid).ravel()[: a.size]
    return np.where(waits > _ROUNDING * s, waits, 0.0)
