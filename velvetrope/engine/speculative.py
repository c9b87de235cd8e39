"""Speculative decoding as a distribution: tokens per verification step and steps per reply.

With a draft length ``k`` and a per-token acceptance rate ``alpha`` (each draft token is
accepted with probability ``alpha``, independently, until the first rejection — the
standard model of Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding", 2023), one verification step emits ``m`` tokens, ``1 <= m <= k + 1``:

    P(m) = alpha**(m - 1) * (1 - alpha)   for m <= k,      P(k + 1) = alpha**k,

the accepted drafts plus the one token the target model samples itself.  Its mean is
``(1 - alpha**(k + 1)) / (1 - alpha)`` (``k + 1`` when ``alpha == 1``).  The number of
steps a reply needs is therefore a random variable, and so is the service time of a
request: :func:`steps_pmf` gives its exact distribution by dynamic programming, with the
last step capped at the tokens still to produce (the batcher never drafts past the end of
a reply, which gives the same distribution).

Cost side (:meth:`~velvetrope.engine.profile.EngineProfile.step_time`): a speculative step
verifies ``k`` extra tokens per sequence and runs the draft model ``k`` times.  The engine
model (:class:`~velvetrope.engine.batcher.Batcher`) samples the acceptances; the planner
measures a service curve on it, so sizing sees both the gain and the cost.

Pure functions; bad arguments raise :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

from velvetrope.errors import PolicyError

__all__ = [
    "acceptance_for_tokens_per_step",
    "decode_time_pmf",
    "expected_tokens_per_step",
    "mean_steps",
    "steps_moments",
    "steps_pmf",
    "tokens_per_step_pmf",
]


def _check(k: int, alpha: float) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise PolicyError(f"draft length k must be an int >= 0 (got {k!r})")
    if not 0.0 <= alpha <= 1.0:
        raise PolicyError(f"acceptance rate alpha must be in [0, 1] (got {alpha!r})")


def tokens_per_step_pmf(k: int, alpha: float) -> list[float]:
    """``[P(m = 1), ..., P(m = k + 1)]``: tokens emitted by one verification step."""
    _check(k, alpha)
    pmf = [alpha**j * (1.0 - alpha) for j in range(k)]
    pmf.append(alpha**k)
    return pmf


def expected_tokens_per_step(k: int, alpha: float) -> float:
    """Mean tokens per verification step: ``(1 - alpha**(k+1)) / (1 - alpha)``."""
    _check(k, alpha)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def acceptance_for_tokens_per_step(k: int, tokens_per_step: float) -> float:
    """The per-token acceptance rate ``alpha`` whose :func:`expected_tokens_per_step` is
    ``tokens_per_step`` (what vLLM reports as the mean acceptance length: accepted drafts
    plus the one token the target model samples, per verification step).

    ``k >= 1`` and ``1 <= tokens_per_step <= k + 1``; the mean is strictly increasing in
    ``alpha``, so the answer is unique (found by bisection to within 1e-12).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise PolicyError(f"draft length k must be an int >= 1 (got {k!r})")
    m = float(tokens_per_step)
    if not 1.0 <= m <= k + 1:
        raise PolicyError(f"tokens per step must be in [1, {k + 1}] for k={k} (got {m!r})")
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        if expected_tokens_per_step(k, mid) < m:
            lo = mid
        else:
            hi = mid
    return 0.0 if m == 1.0 else 1.0 if m == k + 1 else 0.5 * (lo + hi)


def steps_moments(
    max_tokens: int, k: int, alpha: float
) -> tuple[list[float], list[float], list[float]]:
    """For ``r = 0 … max_tokens`` tokens to emit: the mean and the second moment of the
    verification steps it takes (the first two moments of :func:`steps_pmf`), and the mean
    draft tokens proposed on the way (``min(k, r' - 1)`` at a step with ``r'`` left, as the
    batcher drafts).  O(max_tokens * k) by first-step analysis, exact.
    """
    _check(k, alpha)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise PolicyError(f"max_tokens must be an int >= 0 (got {max_tokens!r})")
    per = tokens_per_step_pmf(k, alpha)
    mean = [0.0] * (max_tokens + 1)
    second = [0.0] * (max_tokens + 1)
    drafts = [0.0] * (max_tokens + 1)
    for r in range(1, max_tokens + 1):
        e1 = e2 = d = 0.0
        for m, p in enumerate(per, start=1):
            if m >= r:
                break
            e1 += p * mean[r - m]
            e2 += p * second[r - m]
            d += p * drafts[r - m]
        mean[r] = 1.0 + e1
        second[r] = 1.0 + 2.0 * e1 + e2
        drafts[r] = min(k, r - 1) + d
    return mean, second, drafts


def steps_pmf(tokens: int, k: int, alpha: float) -> list[float]:
    """``p[s]`` = probability that emitting ``tokens`` tokens takes exactly ``s`` steps.

    Each step emits ``min(m, tokens left)`` with ``m`` drawn from
    :func:`tokens_per_step_pmf`.  ``tokens == 0`` takes 0 steps; with ``k == 0`` it takes
    exactly ``tokens`` steps.  Exact (no sampling); O(tokens**2 * k) time.
    """
    _check(k, alpha)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise PolicyError(f"tokens must be an int >= 0 (got {tokens!r})")
    per = tokens_per_step_pmf(k, alpha)
    # dist[r][s]: P(r tokens left take s steps)
    dist: list[list[float]] = [[1.0]]
    for r in range(1, tokens + 1):
        acc = [0.0] * (r + 1)
        tail = 0.0  # P(m >= r): the step finishes the reply
        for m, p in enumerate(per, start=1):
            if m >= r:
                tail += p
                continue
            for s, q in enumerate(dist[r - m]):
                acc[s + 1] += p * q
        acc[1] += tail
        dist.append(acc)
    return dist[tokens]


def mean_steps(tokens: int, k: int, alpha: float) -> float:
    """Expected verification steps to emit ``tokens`` tokens (the mean of :func:`steps_pmf`)."""
    return sum(s * p for s, p in enumerate(steps_pmf(tokens, k, alpha)))


def decode_time_pmf(tokens: int, k: int, alpha: float, step_s: float) -> list[tuple[float, float]]:
    """``(seconds, probability)`` of the decode time of a reply at a fixed step time.

    The service-time distribution of :func:`steps_pmf` scaled by ``step_s`` (the step time
    at the operating point, speculative overhead included); zero-probability entries are
    left out.
    """
    if not step_s > 0.0:
        raise PolicyError(f"step_s must be > 0 (got {step_s!r})")
    return [(s * step_s, p) for s, p in enumerate(steps_pmf(tokens, k, alpha)) if p > 0.0]
