"""Measurements: what a client timed for each probe, turned into regression rows.

:func:`observations_from_run` reads one probe run's chunk arrival times into
:class:`Observation` rows (a measured interval and the engine steps it holds);
:func:`aggregate_observations` reduces repeats to their median.  Pure.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from velvetrope.engine.calibrate.plan import Features, Probe, mixed_features, single_features
from velvetrope.engine.profile import EngineProfile
from velvetrope.errors import PolicyError

__all__ = [
    "Observation",
    "ProbeRun",
    "RequestTrace",
    "aggregate_observations",
    "observations_from_run",
]

_MIN_WINDOW_STEPS = 8


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
        a = bisect_left(ch, lo)  # first chunk at or after lo
        b = bisect_right(ch, hi) - 1  # last chunk at or before hi
        if b - a < _MIN_WINDOW_STEPS:
            continue
        a, b = _envelope_pair(ch, a, b, (b - a) // 4)
        sums = []
        for frac in (0.25, 0.5, 0.75):
            m = a + int((b - a) * frac)
            tau = 0.5 * (ch[m] + ch[m + 1])
            sums.append(sum(bisect_right(o.chunks, tau) - (m + 1) for o in traces))
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
    before = bisect_left(ch, guest.sent) - 1  # last host chunk before the guest was sent
    after = bisect_right(ch, guest.chunks[-1] + 0.5 * gap)  # first one well after it ended
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
