"""The calibration sweep: what each probe asks for, and what the engine schedules for it.

:func:`make_plan` sizes the probes (``single``, ``mixed``, ``batch``; see
:mod:`velvetrope.engine.calibrate`) for an engine's limits; :func:`single_features` and
:func:`mixed_features` step a real :class:`~velvetrope.engine.batcher.Batcher` to say how
many steps, prefill tokens, decoders and context tokens a measured interval holds.  Pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from velvetrope.engine.batcher import Batcher, Finished, FirstToken, StepResult
from velvetrope.engine.profile import EngineProfile
from velvetrope.errors import PolicyError

__all__ = [
    "Features",
    "Probe",
    "ProbeKind",
    "make_plan",
    "mixed_features",
    "plan_requests",
    "single_features",
]

ProbeKind = Literal["single", "mixed", "batch"]

_PROMPT_MARGIN = 64  # tokens kept below max_model_len (BOS, a different tokenizer)
_MIN_PROMPT = 16


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
