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

(:meth:`EngineProfile.step_time`).  What a step holds follows vLLM v1's scheduler as
modelled by :mod:`velvetrope.engine.batcher`: running sequences first (a decoder costs one
token of the ``max_num_batched_tokens`` budget), then prompt chunks with what is left;
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
exactly what our engine schedules.  Assumptions about a real engine: FCFS, chunked
prefill with the base profile's budget, no preemption during the sweep (the plan stays
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

Contract: :func:`calibrate` sends ``plan_requests(plan) + 1`` requests at most, one probe
at a time, starts no probe after ``max_seconds``, and raises
:class:`~velvetrope.errors.UpstreamUnreachable` when the endpoint cannot be reached,
:class:`~velvetrope.errors.UpstreamTimeout` when a stream stays silent too long,
:class:`~velvetrope.errors.UpstreamError` for bad answers or too few usable measurements
and :class:`~velvetrope.errors.PolicyError` for bad settings.  Everything exported but
:func:`calibrate` is pure and synchronous.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp
import numpy as np
import orjson
from numpy.typing import NDArray

from velvetrope.engine.batcher import Batcher, Finished, FirstToken, StepResult, Tokens
from velvetrope.engine.profile import EngineProfile, load_profile, profile_to_yaml
from velvetrope.errors import (
    PolicyError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
    VelvetropeError,
)
from velvetrope.tokenizer import Tokenizer, get_tokenizer

__all__ = [
    "COEFFICIENTS",
    "DEFAULT_BASE_PROFILE",
    "CalibrationResult",
    "CalibrationSettings",
    "Features",
    "Fit",
    "Observation",
    "Probe",
    "ProbeKind",
    "ProbeRun",
    "RequestTrace",
    "aggregate_observations",
    "build_profile",
    "calibrate",
    "calibrated_yaml",
    "fit_observations",
    "make_plan",
    "mixed_features",
    "observations_from_run",
    "plan_requests",
    "relative_errors",
    "simulate_runs",
    "single_features",
]

COEFFICIENTS: tuple[str, ...] = (
    "step_base_s",
    "per_prefill_token_s",
    "per_decode_seq_s",
    "per_context_token_s",
)
"""The profile fields the fit estimates, in design-matrix column order."""

DEFAULT_BASE_PROFILE = "llama3-8b-h100"
"""``velvetrope engine``'s default profile: where KV and scheduler limits come from."""

ProbeKind = Literal["single", "mixed", "batch"]

_PROMPT_MARGIN = 64  # tokens kept below max_model_len (BOS, a different tokenizer)
_MIN_PROMPT = 16
_MIN_WINDOW_STEPS = 8
_WARMUP_PROMPT = 512  # tokens; also measures the endpoint's tokenizer against cl100k_base
_BURSTY = 0.25  # fraction of short chunk gaps above which a note warns of bursty deliveries
_FILLER = " hello"  # one cl100k_base token per repetition


# -- features: what the engine schedules ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Features:
    """Sums over the steps of one interval: how many steps, and their total composition."""

    steps: int = 0
    prefill_tokens: int = 0
    decode_seqs: int = 0
    context_tokens: int = 0

    def __add__(self, other: Features) -> Features:
        return Features(
            self.steps + other.steps,
            self.prefill_tokens + other.prefill_tokens,
            self.decode_seqs + other.decode_seqs,
            self.context_tokens + other.context_tokens,
        )

    @staticmethod
    def of(step: StepResult) -> Features:
        """The features of one batcher step."""
        return Features(1, step.prefill_tokens, step.decode_seqs, step.context_tokens)


def _scheduler(limits: EngineProfile, tokens: int) -> Batcher:
    """A batcher with ``limits``' budget and block size and room for ``tokens`` (no preemption)."""
    bs = limits.block_size
    blocks = max(limits.num_gpu_blocks, -(-2 * tokens // bs) + 1)
    prof = limits.with_overrides(num_gpu_blocks=blocks, max_model_len=blocks * bs)
    return Batcher(prof, token_events=False)


def single_features(limits: EngineProfile, prompt: int, output: int) -> tuple[Features, Features]:
    """``(ttft, decode_span)`` features of one request alone in the engine.

    ``ttft``: the steps up to and including the one that emits the first token (the
    prefill, chunked by ``limits.max_num_batched_tokens``).  ``decode_span``: the steps
    after it, up to the last token (``output - 1`` single-decoder steps).
    """
    b = _scheduler(limits, prompt + output)
    b.add("s", prompt, output, 0.0)
    ttft = span = Features()
    first = False
    for r in _steps(b):
        if first:
            span += Features.of(r)
        else:
            ttft += Features.of(r)
            first = any(isinstance(e, FirstToken) for e in r.events)
    return ttft, span


def _steps(b: Batcher) -> Iterator[StepResult]:
    """Step ``b`` back to back from time 0 until it has no work (the caller may add more)."""
    t = 0.0
    while b.has_work:
        r = b.step(t)
        t = r.end
        yield r


def mixed_features(
    limits: EngineProfile, host_prompt: int, host_output: int, guest_prompt: int, guest_output: int
) -> Features:
    """Features of the host's span (first to last token) when a guest arrives after the host's
    first token and is served entirely within that span.

    Raises :class:`~velvetrope.errors.PolicyError` if, even admitted at once, the guest
    would not finish before the host (the host's output is too short for the guest).
    """
    b = _scheduler(limits, host_prompt + host_output + guest_prompt + guest_output)
    b.add("h", host_prompt, host_output, 0.0)
    span = Features()
    first = guest_done = False
    for r in _steps(b):
        if first:
            span += Features.of(r)
        for e in r.events:
            if isinstance(e, FirstToken) and e.seq_id == "h":
                first = True
                b.add("g", guest_prompt, guest_output, r.end)
            elif isinstance(e, Finished):
                if e.seq_id == "g":
                    guest_done = True
                elif not guest_done:
                    raise PolicyError(
                        f"a guest of {guest_prompt} prompt tokens does not finish within a "
                        f"host span of {host_output} tokens"
                    )
                else:
                    return span
    return span


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Probe:
    """One measurement: see the module docstring for the three kinds.

    ``prompt_tokens`` / ``output_tokens`` are targets for each request (the host's, for
    ``mixed``); ``streams`` is ``n`` for ``batch``; ``guest_prompt_tokens`` is the mixed
    probe's guest prompt (the guest asks for one output token), sent when the host's
    chunk number ``guest_after`` arrives.
    """

    kind: ProbeKind
    prompt_tokens: int
    output_tokens: int
    streams: int = 1
    guest_prompt_tokens: int = 0
    guest_after: int = 1

    @property
    def label(self) -> str:
        """A short unique name, e.g. ``batch n=16 P=4096 N=128``."""
        if self.kind == "single":
            return f"single P={self.prompt_tokens} N={self.output_tokens}"
        if self.kind == "mixed":
            return (
                f"mixed P={self.prompt_tokens} N={self.output_tokens} "
                f"guest={self.guest_prompt_tokens}"
            )
        return f"batch n={self.streams} P={self.prompt_tokens} N={self.output_tokens}"

    @property
    def requests(self) -> int:
        """HTTP requests this probe sends."""
        return 2 if self.kind == "mixed" else self.streams


def plan_requests(plan: Sequence[Probe]) -> int:
    """Requests a plan sends (without the one warm-up request)."""
    return sum(p.requests for p in plan)


def make_plan(
    limits: EngineProfile,
    *,
    quick: bool = False,
    repeats: int | None = None,
    max_model_len: int | None = None,
) -> tuple[Probe, ...]:
    """The sweep for an engine with ``limits``' scheduler and KV cache.

    Prompt lengths scale with the context limit ``L = min(limits.max_model_len,
    max_model_len)`` (the endpoint's, if it reports one); concurrency is capped by
    ``max_num_seqs`` and by half the KV cache, so nothing is preempted.  Full sweep
    (``repeats`` defaults to 3): single prompts ``16, L/8, L/4, L/2, L-160`` with 96 output
    tokens; mixed guests ``L/4, L/2, L-64`` in a 128-token host span; batches of
    ``(64, 16), (16, 16), (16, L/2), (32, L/4)`` streams × prompt tokens.  ``quick``
    (``repeats`` 1): singles ``16, L/2, L-112`` with 48 tokens, one mixed guest ``L/2`` in
    a 64-token span, batches ``(16, 16), (8, L/2)``.  Repeats are interleaved.
    Raises :class:`~velvetrope.errors.PolicyError` if ``L`` leaves no room for the sweep.
    """
    ctx = (
        limits.max_model_len if max_model_len is None else min(max_model_len, limits.max_model_len)
    )
    reps = 3 if repeats is None else repeats
    if reps < 1:
        raise PolicyError(f"repeats must be >= 1, got {reps}")
    single_out, host_out, window = (48, 64, 64) if quick else (96, 128, 96)
    if ctx < 4 * _PROMPT_MARGIN + host_out:
        raise PolicyError(f"max_model_len {ctx} is too short to calibrate (need >= 384 tokens)")
    top = ctx - _PROMPT_MARGIN

    def clamp(p: int, out: int) -> int:
        return max(_MIN_PROMPT, min(p, top - out))

    if quick:
        singles = [16, ctx // 2, top]
        guests = [ctx // 2]
        batches = [(32, 16), (2, 16), (8, ctx // 2)]
    else:
        singles = [16, ctx // 8, ctx // 4, ctx // 2, top]
        guests = [ctx // 4, ctx // 2, top]
        batches = [(64, 16), (16, 16), (16, ctx // 2), (32, ctx // 4)]
    probes: list[Probe] = []
    for p in sorted({clamp(p, single_out) for p in singles}):
        probes.append(Probe("single", p, single_out))
    for g in sorted({clamp(g, 1) for g in guests}):
        probes.append(Probe("mixed", _MIN_PROMPT, host_out, 1, g, host_out // 4))
    kv_tokens = limits.kv_capacity_tokens()
    budget = limits.max_num_batched_tokens
    seen: set[tuple[int, int]] = set()
    for n, p in batches:
        n = min(n, limits.max_num_seqs)
        startup = -(-n * p // budget) + 16
        out = startup + window
        p = clamp(p, out)
        while n > 1 and n * (p + out + limits.block_size) > kv_tokens // 2:
            n //= 2
        if n < 2 or (n, p) in seen:
            continue
        seen.add((n, p))
        probes.append(Probe("batch", p, out, n))
    return tuple(probes) * reps


# -- measurements -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """What a client measured for one streamed request (wall seconds, any common origin).

    ``chunks`` holds the arrival time of every chunk that carried a choice (one per
    token on engines without speculative decoding), in order; the counts come from the
    final usage chunk.
    """

    sent: float
    chunks: tuple[float, ...]
    prompt_tokens: int
    completion_tokens: int

    @property
    def exact(self) -> bool:
        """One chunk per token: per-chunk positions are token positions."""
        return len(self.chunks) == self.completion_tokens


@dataclass(frozen=True, slots=True)
class ProbeRun:
    """One execution of a probe: ``single`` one trace, ``mixed`` (host, guest), ``batch`` n."""

    probe: Probe
    traces: tuple[RequestTrace, ...]


@dataclass(frozen=True, slots=True)
class Observation:
    """A measured interval of ``steps`` engine steps and what they contained (totals).

    ``seconds`` is in model seconds (wall × speed).  ``requests`` counts the per-request
    overheads the interval includes (1 for a TTFT, 0 for spans between chunks) and
    ``request_tokens`` the prompt tokens those requests carried (their per-token overhead:
    transfer, parsing, tokenizing).  Fields are floats because
    :func:`aggregate_observations` averages rows.  ``spread_s`` is the standard error of
    :attr:`step_seconds` estimated from repeats (0: unknown); ``bursty`` the fraction of
    chunk gaps under a third of the median (deliveries in bursts: someone on the path was
    not keeping up; 0 when not measured).
    """

    kind: str
    label: str
    seconds: float
    steps: float
    prefill_tokens: float
    decode_seqs: float
    context_tokens: float
    requests: float = 0.0
    request_tokens: float = 0.0
    spread_s: float = 0.0
    bursty: float = 0.0

    @property
    def step_seconds(self) -> float:
        """The mean step time ``seconds / steps`` (the regression's response)."""
        return self.seconds / self.steps


def _obs(
    kind: str, label: str, seconds: float, f: Features, requests: int = 0, tokens: int = 0
) -> Observation:
    return Observation(
        kind,
        label,
        seconds,
        float(f.steps),
        float(f.prefill_tokens),
        float(f.decode_seqs),
        float(f.context_tokens),
        float(requests),
        float(tokens),
    )


def observations_from_run(
    run: ProbeRun, limits: EngineProfile, speed: float = 1.0
) -> tuple[list[Observation], list[str]]:
    """The regression rows one probe run yields, and notes on anything discarded.

    ``single``: a ``ttft`` row and (with >= 12 tokens) a ``decode`` row; ``mixed``: a
    ``mixed`` row if the guest was served inside the host's span; ``batch``: one ``batch``
    row (the median over streams of the steady-window step time) if every stream streamed
    one chunk per token and the streams overlapped for at least 8 steps.  Span endpoints
    are the least-delayed chunks near each end (:func:`_envelope_pair`).  Times are
    multiplied by ``speed``.
    """
    p = run.probe
    label = p.label
    out: list[Observation] = []
    if p.kind == "single":
        (tr,) = run.traces
        if not tr.chunks:
            return out, [f"{label}: no token streamed"]
        ttft_f, _ = single_features(limits, tr.prompt_tokens, tr.completion_tokens)
        out.append(
            _obs("ttft", label, (tr.chunks[0] - tr.sent) * speed, ttft_f, 1, tr.prompt_tokens)
        )
        if tr.exact and tr.completion_tokens >= 12:
            obs, _why = _window_observation("decode", label, (tr,), speed, -math.inf, math.inf)
            if obs is not None:
                out.append(obs)
        elif tr.completion_tokens >= 3 and len(tr.chunks) >= 2:
            _, span_f = single_features(limits, tr.prompt_tokens, tr.completion_tokens)
            out.append(_obs("decode", label, (tr.chunks[-1] - tr.chunks[0]) * speed, span_f))
        return out, []
    if p.kind == "mixed":
        host, guest = run.traces
        return _mixed_observation(host, guest, p, limits, speed)
    obs, why = _window_observation("batch", label, run.traces, speed, -math.inf, math.inf)
    return ([obs], []) if obs is not None else ([], [f"{label}: {why}"])


def _envelope_pair(ch: Sequence[float], a: int, b: int, q: int) -> tuple[int, int]:
    """The least-delayed chunk among ``a .. a+q`` and among ``b-q .. b``.

    A chunk's arrival is its step's end plus a delay that is never negative (network,
    a server or client busy with other streams, an engine catching up with its
    timeline) and often near its minimum; the chunk with the smallest ``t_c - y·c``
    (``y`` the mean gap) near each end is the one least delayed.  Symmetric noise biases
    both ends alike, which cancels in the span.
    """
    y = (ch[b] - ch[a]) / (b - a)
    i = min(range(a, a + q + 1), key=lambda c: ch[c] - y * c)
    j = min(range(b - q, b + 1), key=lambda c: ch[c] - y * c)
    return i, j


def _window_observation(
    kind: str,
    label: str,
    traces: Sequence[RequestTrace],
    speed: float,
    lo: float,
    hi: float,
) -> tuple[Observation | None, str]:
    """A row for the steps where all ``traces`` (n >= 1 streams) were decoding (and
    ``""``), or ``None`` and why not.

    The window runs from the last first chunk to the first last chunk, half a median
    gap inside each end, further clipped to ``(lo, hi)``.  For each stream the span
    runs between its least-delayed chunks in the window's first and last quarters; the
    ``k`` steps of a span each hold ``n`` decoders, and the step emitting chunk ``c`` of
    this stream has context ``Σ_k (P_k + c + o_k)`` (``o_k``: stream ``k``'s token offset,
    read from the chunk counts between two chunks, at a quarter, half and three quarters
    of the span).  The row is the median over streams of the per-step time with the mean
    per-step composition.
    """
    if any(not t.exact or len(t.chunks) < 2 for t in traces):
        return None, "a stream did not stream exactly one chunk per token"
    n = len(traces)
    start = max(max(t.chunks[0] for t in traces), lo)
    end = min(min(t.chunks[-1] for t in traces), hi)
    gaps = [
        b - a
        for t in traces
        for a, b in zip(t.chunks, t.chunks[1:], strict=False)
        if start <= a and b <= end
    ]
    if len(gaps) < n * _MIN_WINDOW_STEPS:
        return None, "the streams overlapped for too few steps (raise the output length)"
    half = 0.5 * statistics.median(gaps) if n > 1 else 0.0
    lo, hi = start + half, end - half
    ys: list[float] = []
    steps_l: list[int] = []
    ctx_per_step: list[float] = []
    prompts = sum(t.prompt_tokens for t in traces)
    for tr in traces:
        ch = tr.chunks
        a = _bisect_left(ch, lo)  # first chunk at or after lo
        b = _bisect_right(ch, hi) - 1  # last chunk at or before hi
        if b - a < _MIN_WINDOW_STEPS:
            continue
        a, b = _envelope_pair(ch, a, b, (b - a) // 4)
        sums = []
        for frac in (0.25, 0.5, 0.75):
            m = a + int((b - a) * frac)
            tau = 0.5 * (ch[m] + ch[m + 1])
            sums.append(sum(_bisect_right(o.chunks, tau) - (m + 1) for o in traces))
        offsets = statistics.median(sums)
        k = b - a
        # steps emitting chunk c = a+1 .. b: context Σ_k (P_k + c + o_k)
        context = k * (prompts + offsets) + n * k * (a + b + 1) / 2
        ys.append((ch[b] - ch[a]) * speed / k)
        steps_l.append(k)
        ctx_per_step.append(context / k)
    if not ys:
        return None, "no stream had a steady window of 8 steps"
    steps = float(statistics.median(steps_l))
    med = statistics.median(gaps)
    bursty = sum(g < med / 3 for g in gaps) / len(gaps)
    return (
        Observation(
            kind,
            label,
            statistics.median(ys) * steps,
            steps,
            0.0,
            float(n) * steps,
            statistics.fmean(ctx_per_step) * steps,
            bursty=bursty,
        ),
        "",
    )


def _mixed_observation(
    host: RequestTrace, guest: RequestTrace, probe: Probe, limits: EngineProfile, speed: float
) -> tuple[list[Observation], list[str]]:
    """The host's span from a least-delayed chunk before the guest was sent to one after the
    guest finished; features: the whole span's (batcher) minus the host-only decode steps
    outside it."""
    label = probe.label
    ch = host.chunks
    if not host.exact or not guest.chunks or len(ch) < 2:
        return [], [f"{label}: incomplete streams, or not one chunk per token"]
    gap = (ch[-1] - ch[0]) / (len(ch) - 1)
    before = _bisect_left(ch, guest.sent) - 1  # last host chunk before the guest was sent
    after = _bisect_right(ch, guest.chunks[-1] + 0.5 * gap)  # first one well after it ended
    last = len(ch) - 1
    if before < 0 or after > last:
        return [], [f"{label}: the guest was not served inside the host's span"]
    q = min(before, last - after, 16)
    a = min(range(before - q, before + 1), key=lambda c: ch[c] - gap * c)
    b = min(range(after, after + q + 1), key=lambda c: ch[c] - gap * c)
    try:
        full = mixed_features(
            limits,
            host.prompt_tokens,
            host.completion_tokens,
            guest.prompt_tokens,
            guest.completion_tokens,
        )
    except PolicyError as exc:
        return [], [f"{label}: {exc}"]
    # host-only decode steps emitting chunks 1..a and b+1..last (context P + c each)
    outside = [*range(1, a + 1), *range(b + 1, last + 1)]
    f = Features(
        full.steps - len(outside),
        full.prefill_tokens,
        full.decode_seqs - len(outside),
        full.context_tokens - sum(host.prompt_tokens + c for c in outside),
    )
    return [_obs("mixed", label, (ch[b] - ch[a]) * speed, f)], []


def _bisect_right(xs: Sequence[float], x: float) -> int:
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < xs[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _bisect_left(xs: Sequence[float], x: float) -> int:
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def aggregate_observations(observations: Iterable[Observation]) -> list[Observation]:
    """One row per ``(kind, label)``: the median step time over repeats, the mean
    per-step composition and the median step count (order of first appearance).

    With 3 or more repeats, ``spread_s`` is the median's standard error estimated from
    their median absolute deviation (``1.4826 · MAD · 1.25 / √k``); ``bursty`` is the
    largest of the repeats'.
    """
    groups: dict[tuple[str, str], list[Observation]] = {}
    for o in observations:
        groups.setdefault((o.kind, o.label), []).append(o)
    rows: list[Observation] = []
    for (kind, label), obs in groups.items():
        steps = float(statistics.median(o.steps for o in obs))

        def per_step(attr: str, obs: list[Observation] = obs, steps: float = steps) -> float:
            return statistics.fmean(getattr(o, attr) / o.steps for o in obs) * steps

        ys = [o.step_seconds for o in obs]
        med = statistics.median(ys)
        spread = 0.0
        if len(ys) >= 3:
            mad = statistics.median(abs(v - med) for v in ys)
            spread = 1.4826 * mad * 1.25 / math.sqrt(len(ys))
        rows.append(
            Observation(
                kind,
                label,
                med * steps,
                steps,
                per_step("prefill_tokens"),
                per_step("decode_seqs"),
                per_step("context_tokens"),
                per_step("requests"),
                per_step("request_tokens"),
                spread,
                max(o.bursty for o in obs),
            )
        )
    return rows


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
        flat = [
            n
            for n, s in zip(names, np.ptp(x, axis=0), strict=True)
            if s == 0 and n != "step_base_s"
        ]
        raise PolicyError(
            f"the measurements do not identify every coefficient (rank {rank} < {p}"
            + (f"; nothing varies {', '.join(flat)}" if flat else "")
            + ")"
        )
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


# -- the HTTP side ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationSettings:
    """Everything :func:`calibrate` needs.

    ``url`` is the endpoint's base URL (``http://host:port`` or ``.../v1``); ``model``
    defaults to the first one ``GET /v1/models`` lists; ``speed_hint`` is K (model seconds
    per wall second: 1 for a real engine); ``base_profile`` (name or YAML file) supplies
    the KV-cache and scheduler limits and the plan's sizes; ``max_seconds`` bounds the
    sweep's wall time (no probe starts after it); ``request_timeout_s`` bounds the silence
    between two reads of a stream.
    """

    url: str
    model: str | None = None
    api_key: str | None = None
    base_profile: str = DEFAULT_BASE_PROFILE
    speed_hint: float = 1.0
    quick: bool = False
    repeats: int | None = None
    max_seconds: float = 600.0
    request_timeout_s: float = 120.0
    name: str | None = None
    jitter_wall_s: float = 5e-4

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.url):
            raise PolicyError(f"--url must be an http(s):// URL, got {self.url!r}")
        for attr in ("speed_hint", "max_seconds", "request_timeout_s"):
            v = getattr(self, attr)
            if not (v > 0 and math.isfinite(v)):
                raise PolicyError(f"{attr} must be a positive number, got {v!r}")

    @property
    def base_url(self) -> str:
        """The URL without a trailing ``/`` or ``/v1``."""
        u = self.url.rstrip("/")
        return u[:-3] if u.endswith("/v1") else u


@dataclass(frozen=True)
class CalibrationResult:
    """The outcome of :func:`calibrate`: the profile, the fit and how it was measured."""

    profile: EngineProfile
    fit: Fit
    base: EngineProfile
    url: str
    model: str
    speed_hint: float
    plan: tuple[Probe, ...]
    runs: tuple[ProbeRun, ...]
    observations: tuple[Observation, ...]
    notes: tuple[str, ...]
    requests: int
    wall_seconds: float
    endpoint_max_model_len: int | None
    finished_at: str


class _Client:
    """Streams completions from one endpoint and times their chunks."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]
    ) -> None:
        self._s = session
        self._url = base_url
        self._headers = headers
        self.requests = 0

    async def get_json(self, path: str) -> Any:
        url = self._url + path
        try:
            async with self._s.get(url, headers=self._headers) as r:
                body = await r.read()
                if r.status != 200:
                    raise UpstreamError(_http_error(url, r.status, body))
        except TimeoutError:
            raise UpstreamTimeout(f"{url} did not answer in time") from None
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamUnreachable(
                f"cannot reach {self._url} (is the endpoint running, is the URL right?): {exc}"
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{url}: {exc}") from None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise UpstreamError(f"{url} did not answer JSON") from None

    async def stream(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        on_chunk: Callable[[int], None] | None = None,
    ) -> RequestTrace:
        url = self._url + "/v1/completions"
        body = orjson.dumps(
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,
            }
        )
        chunks: list[float] = []
        usage: dict[str, Any] | None = None
        self.requests += 1
        clock = time.perf_counter
        try:
            sent = clock()
            async with self._s.post(
                url, data=body, headers={**self._headers, "content-type": "application/json"}
            ) as r:
                if r.status != 200:
                    raise UpstreamError(_http_error(url, r.status, await r.read()))
                async for line in r.content:
                    now = clock()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        break
                    try:
                        ev = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        raise UpstreamError(f"{url}: a stream event is not JSON") from None
                    if not isinstance(ev, dict):
                        continue
                    if "error" in ev:
                        raise UpstreamError(f"{url}: the stream ended with an error: {ev['error']}")
                    if ev.get("choices"):
                        chunks.append(now)
                        if on_chunk is not None:
                            on_chunk(len(chunks))
                    u = ev.get("usage")
                    if isinstance(u, dict):
                        usage = u
        except TimeoutError:
            raise UpstreamTimeout(
                f"{url} stopped streaming for more than the request timeout"
            ) from None
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamUnreachable(
                f"cannot reach {self._url} (is the endpoint running, is the URL right?): {exc}"
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{url}: {exc}") from None
        if usage is None:
            raise UpstreamError(
                f"{url} sent no usage chunk: the endpoint must support stream_options.include_usage"
            )
        try:
            prompt_tokens = int(usage["prompt_tokens"])
            completion_tokens = int(usage["completion_tokens"])
        except (KeyError, TypeError, ValueError):
            raise UpstreamError(f"{url} sent a usage chunk without token counts") from None
        return RequestTrace(sent, tuple(chunks), prompt_tokens, completion_tokens)


def _http_error(url: str, status: int, body: bytes) -> str:
    msg = body[:300].decode("utf-8", "replace")
    try:
        doc = orjson.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            msg = str(doc["error"].get("message", msg))
        elif isinstance(doc, dict) and "message" in doc:
            msg = str(doc["message"])
    except orjson.JSONDecodeError:
        pass
    hint = " (pass --api-key)" if status in (401, 403) else ""
    return f"{url} answered HTTP {status}{hint}: {msg}"


class _Prompts:
    """Prompts of a target length: a unique tag (defeats prefix caching) + filler.

    Lengths are counted with ``cl100k_base``; :meth:`adapt` rescales the filler once the
    endpoint has reported how many tokens its own tokenizer made of a known prompt.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._run = uuid.uuid4().hex[:8]
        self._i = 0
        self._ratio = 1.0  # endpoint tokens per cl100k token of filler

    def make(self, tokens: int) -> str:
        self._i += 1
        tag = f"calibration {self._run}.{self._i}:"
        n = round((tokens - self._tok.count(tag)) / self._ratio)
        return tag + _FILLER * max(1, n)

    def adapt(self, target: int, reported: int) -> None:
        """The endpoint counted ``reported`` tokens for a prompt made for ``target``."""
        if target > 0 and reported > 0:
            self._ratio = min(4.0, max(0.25, reported / target))


def _unwrap(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of an exception group, preferring our own errors."""
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[BaseException]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(group)
    for e in leaves:
        if isinstance(e, VelvetropeError):
            return e
    return leaves[0]


async def _run_probe(client: _Client, model: str, prompts: _Prompts, probe: Probe) -> ProbeRun:
    """Run one probe against the endpoint (one request, a host and a guest, or a batch)."""
    try:
        if probe.kind == "single":
            tr = await client.stream(model, prompts.make(probe.prompt_tokens), probe.output_tokens)
            return ProbeRun(probe, (tr,))
        if probe.kind == "mixed":
            ready = asyncio.Event()
            host_prompt = prompts.make(probe.prompt_tokens)
            guest_prompt = prompts.make(probe.guest_prompt_tokens)

            async def guest() -> RequestTrace:
                await ready.wait()
                return await client.stream(model, guest_prompt, 1)

            def on_chunk(count: int) -> None:
                if count == probe.guest_after:
                    ready.set()

            async with asyncio.TaskGroup() as tg:
                h = tg.create_task(
                    client.stream(model, host_prompt, probe.output_tokens, on_chunk=on_chunk)
                )
                g = tg.create_task(guest())
            return ProbeRun(probe, (h.result(), g.result()))
        texts = [prompts.make(probe.prompt_tokens) for _ in range(probe.streams)]
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(client.stream(model, t, probe.output_tokens)) for t in texts]
        return ProbeRun(probe, tuple(t.result() for t in tasks))
    except BaseExceptionGroup as eg:
        raise _unwrap(eg) from None


async def calibrate(
    settings: CalibrationSettings, progress: Callable[[str], None] | None = None
) -> CalibrationResult:
    """Run the sweep against ``settings.url``, fit, and build the calibrated profile.

    ``progress`` receives one line per probe.  See the module docstring for the bounds
    and the errors raised.
    """
    say = progress or (lambda _msg: None)
    try:
        base = load_profile(settings.base_profile)
    except VelvetropeError as exc:
        raise PolicyError(f"--base-profile: {exc}") from None
    headers = {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=10.0, sock_read=settings.request_timeout_s
    )
    t0 = time.monotonic()
    runs: list[ProbeRun] = []
    notes: list[str] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        client = _Client(session, settings.base_url, headers)
        try:
            models = await client.get_json("/v1/models")
        except UpstreamUnreachable:
            raise
        except UpstreamError:
            if settings.model is None:
                raise
            models = None  # no model list: trust --model, no max_model_len
        model, mml = _pick_model(models, settings.model, settings.base_url)
        plan = make_plan(base, quick=settings.quick, repeats=settings.repeats, max_model_len=mml)
        prompts = _Prompts(get_tokenizer("cl100k_base"))
        say(
            f"calibrating {settings.base_url} model={model}: {len(plan)} probes, "
            f"{plan_requests(plan)} requests, speed hint {settings.speed_hint:g}"
        )
        warm = await client.stream(model, prompts.make(_WARMUP_PROMPT), 4)  # not measured
        prompts.adapt(_WARMUP_PROMPT, warm.prompt_tokens)
        for i, probe in enumerate(plan, 1):
            elapsed = time.monotonic() - t0
            if elapsed > settings.max_seconds:
                notes.append(
                    f"stopped after {i - 1} of {len(plan)} probes: --max-seconds "
                    f"{settings.max_seconds:g} reached"
                )
                say(notes[-1])
                break
            ts = time.monotonic()
            runs.append(await _run_probe(client, model, prompts, probe))
            say(f"  [{i}/{len(plan)}] {probe.label}: {time.monotonic() - ts:.2f} s")
        requests = client.requests
    wall = time.monotonic() - t0
    observations: list[Observation] = []
    for run in runs:
        obs, why = observations_from_run(run, base, settings.speed_hint)
        observations.extend(obs)
        notes.extend(why)
    rows = aggregate_observations(observations)
    bursty = [o for o in rows if o.bursty > _BURSTY]
    if bursty:
        worst = max(bursty, key=lambda o: o.bursty)
        notes.append(
            f"deliveries came in bursts in {len(bursty)} probe(s) (up to {worst.bursty:.0%} "
            f"of chunk gaps under a third of the median, {worst.label}): the client, the "
            f"server or the engine was not keeping up; spans use the least-delayed chunks, "
            f"but a lower speed (or a less loaded machine) measures better"
        )
    try:
        fit = fit_observations(rows, jitter_s=settings.jitter_wall_s * settings.speed_hint)
    except PolicyError as exc:
        raise UpstreamError(f"not enough usable measurements to calibrate: {exc}") from None
    finished = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = settings.name or "calibrated-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", model) or "model")
    profile = build_profile(
        fit, base, name, f"calibrated from {model} at {settings.base_url} on {finished[:10]}"
    )
    return CalibrationResult(
        profile=profile,
        fit=fit,
        base=base,
        url=settings.base_url,
        model=model,
        speed_hint=settings.speed_hint,
        plan=plan,
        runs=tuple(runs),
        observations=tuple(observations),
        notes=tuple(dict.fromkeys(notes)),
        requests=requests,
        wall_seconds=wall,
        endpoint_max_model_len=mml,
        finished_at=finished,
    )


def _pick_model(models: Any, wanted: str | None, url: str) -> tuple[str, int | None]:
    """The model to use and its ``max_model_len`` (vLLM lists it), from ``/v1/models``."""
    data = models.get("data") if isinstance(models, dict) else None
    entries = (
        [m for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []
    )
    if wanted is None:
        if not entries:
            raise UpstreamError(f"{url}/v1/models lists no model: pass --model")
        entry = entries[0]
    else:
        entry = next((m for m in entries if m["id"] == wanted), {"id": wanted})
    mml = entry.get("max_model_len")
    return str(entry["id"]), mml if isinstance(mml, int) and mml > 0 else None


# -- the report ------------------------------------------------------------------------------------


def _fmt_probe_set(plan: Sequence[Probe]) -> list[str]:
    uniq = list(dict.fromkeys(plan))
    reps = len(plan) // max(1, len(uniq))
    singles = [p for p in uniq if p.kind == "single"]
    mixed = [p for p in uniq if p.kind == "mixed"]
    batches = [p for p in uniq if p.kind == "batch"]
    lines = [f"{len(uniq)} probes x {reps} repeats (interleaved):"]
    if singles:
        lines.append(
            f"  single: prompt {[p.prompt_tokens for p in singles]} tokens, "
            f"{singles[0].output_tokens} output tokens"
        )
    if mixed:
        lines.append(
            f"  mixed: host {mixed[0].prompt_tokens}+{mixed[0].output_tokens} tokens, guest "
            f"prompt {[p.guest_prompt_tokens for p in mixed]} tokens"
        )
    if batches:
        lines.append(
            "  batch (streams x prompt / output): "
            + ", ".join(f"{p.streams}x{p.prompt_tokens}/{p.output_tokens}" for p in batches)
        )
    return lines


def calibrated_yaml(result: CalibrationResult) -> str:
    """The profile YAML (:func:`~velvetrope.engine.profile.profile_to_yaml`) preceded by
    comments that state the endpoint, the sweep and the fit quality."""
    fit = result.fit
    b = result.base
    lines = [
        f"Calibrated by `velvetrope calibrate` at {result.finished_at}.",
        f"endpoint: {result.url}  model: {result.model}  speed hint K={result.speed_hint:g} "
        "(model seconds = measured wall seconds x K)",
        f"sweep: {result.requests} requests (one a discarded warm-up) in "
        f"{result.wall_seconds:.1f} s wall; " + "\n".join(_fmt_probe_set(result.plan)),
        f"fit: weighted least squares over {len(fit.rows)} rows (median of repeats, "
        "per-step normalised); client-side timings and usage only",
        f"  R^2 = {fit.r2:.6f}; relative residuals rms {fit.rms_rel_residual:.2%}, "
        f"max {fit.max_rel_residual:.2%} ({fit.worst_row})",
    ]
    for n in COEFFICIENTS:
        v, se = fit.coefficients[n], fit.stderr[n]
        rel = f"+/- {se / v:.1%}" if v > 0 and math.isfinite(se) else "(no error estimate)"
        lines.append(f"  {n:<20} = {v:.4g} {rel} (1 s.e.)")
    if fit.at_bound:
        lines.append(f"  at the non-negativity bound (not resolved): {', '.join(fit.at_bound)}")
    ctx = fit.coefficients["per_context_token_s"] * (b.max_model_len // 2)
    lines.append(
        f"  per_context_token_s x {b.max_model_len // 2} tokens = {ctx * 1e3:.3f} ms per "
        f"sequence-step (step_base_s = {fit.coefficients['step_base_s'] * 1e3:.3f} ms)"
    )
    if fit.overhead_s is not None:
        per_tok = (
            ""
            if fit.overhead_per_token_s is None
            else f" {fit.overhead_per_token_s / result.speed_hint * 1e6:+.3f} us per prompt token"
        )
        lines.append(
            f"  TTFT beyond the engine's steps (not in the profile): "
            f"{fit.overhead_s / result.speed_hint * 1e3:.2f} ms{per_tok} (wall)"
        )
    lines.append(
        f"KV-cache and scheduler limits (block_size .. max_model_len) are copied from the "
        f"base profile {b.name!r}, not measured"
        + (
            f"; the endpoint reports max_model_len {result.endpoint_max_model_len}"
            if result.endpoint_max_model_len not in (None, b.max_model_len)
            else ""
        )
    )
    lines.extend(f"note: {n}" for n in result.notes)
    comment = "".join(f"# {part}\n" for ln in lines for part in ln.splitlines() or [""])
    return comment + "#\n" + profile_to_yaml(result.profile)
