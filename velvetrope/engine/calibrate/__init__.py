"""Calibrate an :class:`~velvetrope.engine.profile.EngineProfile` from a live endpoint.

``velvetrope calibrate --url URL`` drives any OpenAI-compatible completions endpoint (a real
vLLM, or our own ``velvetrope engine``) with a bounded sweep of streaming requests
(``ignore_eos``, ``stream_options.include_usage``), times every streamed chunk **on the
client side**, and fits the profile's four step-time coefficients by weighted least
squares.  Nothing engine-specific is read: only chunk arrival times and the final
``usage`` (our engine's extra ``velvetrope`` field is deliberately ignored).

The regression model
--------------------
A continuous-batching engine runs iterations ("steps"); one step lasts ::

    step = step_base_s + per_prefill_token_s * prefill_tokens
                       + per_decode_seq_s    * decode_seqs
                       + per_context_token_s * context_tokens

(:meth:`EngineProfile.step_time`).  What a step holds follows the base profile's scheduler
(``profile.scheduler``) as modelled by :mod:`velvetrope.engine.batcher`, and the fitted
profile keeps that scheduler.  With ``vllm-v1`` (the default): running sequences first (a
decoder costs one token of the ``max_num_batched_tokens`` budget), then prompt chunks with
what is left (``vllm-v0``: admitted prompts in steps of their own);
``context_tokens`` sums, over the scheduled sequences, the KV length each attends to
*after* the step (``computed + new``).  A decoder emits one token per step, and the step
that emits token ``c+1`` of a request (chunk ``c``, 0-based, ``c >= 1``) has that
request's context ``P + c``.  So a measured interval between two chunk arrivals is a
**sum of steps of known composition**, linear in the four coefficients.  Three probes
make them identifiable:

``single`` (one request alone: prompt ``P``, ``N`` output tokens)
    *TTFT* = the prefill step(s) of ``P`` (chunked by the budget) + a per-request overhead
    ``h + h_tok·P`` (HTTP, parsing, tokenizing, delivery: nuisance terms fitted alongside,
    reported, not part of the profile).  *Decode span* = steps of one decoder with
    contexts ``P + c``: ``k (base + decode) + context·Σ(P + c)``.  Several ``P`` (up to the
    context limit) separate ``base + decode`` from ``context``.
``mixed`` (a short host request decoding ``N`` tokens; when its chunk ``N/4`` arrives, a
guest with a long prompt ``G`` and one output token is sent)
    The guest's prefill chunk(s) ride in the host's steps: the host's span across them is
    its decode steps **plus** ``prefill·G + context·Σ(chunk contexts)``, and no extra step.
    This measures the prefill cost free of any network overhead.
``batch`` (``n`` requests at once, prompt ``P``)
    Arrivals are staggered by the network, so only the window where all ``n`` decode is
    used: from the last first chunk to the first last chunk (half a median gap inside
    each end).  Each of those steps holds ``n`` decoders, with context ``Σ_k (P_k + c +
    o_k)`` at this stream's chunk ``c`` (``o_k``: stream ``k``'s token offset, read from the
    chunk counts mid-window).  Several ``n`` separate ``decode`` from ``base``; long prompts
    give ``context`` leverage (``n·P`` tokens attended per step).

The TTFT and mixed features (step counts, prefill chunking, chunk contexts) come from
stepping a real :class:`~velvetrope.engine.batcher.Batcher` with the base profile's
scheduler limits and the token counts the server reported, so the regression model is
exactly what our engine schedules.  Assumptions about a real engine: FCFS, the base
profile's scheduler and budget, no preemption during the sweep (the plan stays
under half the base profile's KV capacity), **no prefix-cache hits** (every prompt starts
with a unique tag), one token per streamed chunk (no speculative decoding; such streams
fall back to their first and last chunk, or are skipped for batch windows).

Measurement and fit
-------------------
Wall seconds are multiplied by the speed hint ``K`` (``velvetrope engine --speed K`` runs
K times faster than real time; a real engine has ``K = 1``).  A chunk arrives at its
step's end plus a delay that is never negative and often near its minimum (a busy client
or server, an engine catching up with its timeline), so a span runs between the
**least-delayed chunks** near each of its ends (the minima of ``t_c - ȳ·c`` over the first
and last quarter), not the raw first and last.  Every probe is repeated (3 times by
default), the repeats interleaved so that a burst of machine load hits different probes,
and each probe's rows reduced to their median.  The fit is
:func:`scipy.optimize.lsq_linear` on rows normalised to one step (mean step time against
mean composition) weighted by ``1/σ``, ``σ = rel_floor·y + jitter/steps`` combined in
quadrature with the spread of the row's repeats, with the coefficients bounded
non-negative (``step_base_s > 0``).  It reports R² over the rows, relative residuals and
each coefficient's standard error.

Layout
------
The model is pure and synchronous: :mod:`.plan` (the probes and what the engine
schedules for them), :mod:`.observe` (measured intervals into regression rows),
:mod:`.fit` (the least-squares fit, and a simulated endpoint) and :mod:`.report`
(:class:`~velvetrope.engine.calibrate.report.CalibrationResult` and its renderings); this
package re-exports them.  :mod:`.client` is the one module that does I/O (aiohttp), and
is imported by name (``velvetrope.engine.calibrate.client``), never from here, so that the
fitting math loads without an HTTP client.  :mod:`.cli` is ``velvetrope calibrate``.

Contract: :func:`~velvetrope.engine.calibrate.client.calibrate` sends
``plan_requests(plan) + 1`` requests at most, one probe at a time, starts no probe after
``max_seconds``, and raises
:class:`~velvetrope.errors.UpstreamUnreachable` when the endpoint cannot be reached,
:class:`~velvetrope.errors.UpstreamTimeout` when a stream stays silent too long,
:class:`~velvetrope.errors.UpstreamError` for bad answers or too few usable measurements
and :class:`~velvetrope.errors.PolicyError` for bad settings.
"""

from velvetrope.engine.calibrate.fit import (
    Fit,
    build_profile,
    fit_observations,
    relative_errors,
    simulate_runs,
)
from velvetrope.engine.calibrate.observe import (
    Observation,
    ProbeRun,
    RequestTrace,
    aggregate_observations,
    observations_from_run,
)
from velvetrope.engine.calibrate.plan import (
    Features,
    Probe,
    ProbeKind,
    make_plan,
    mixed_features,
    plan_requests,
    single_features,
)
from velvetrope.engine.calibrate.report import CalibrationResult, calibrated_yaml, render_report
from velvetrope.engine.profile import COEFFICIENTS

__all__ = [
    "COEFFICIENTS",
    "CalibrationResult",
    "Features",
    "Fit",
    "Observation",
    "Probe",
    "ProbeKind",
    "ProbeRun",
    "RequestTrace",
    "aggregate_observations",
    "build_profile",
    "calibrated_yaml",
    "fit_observations",
    "make_plan",
    "mixed_features",
    "observations_from_run",
    "plan_requests",
    "relative_errors",
    "render_report",
    "simulate_runs",
    "single_features",
]
