"""Engine features the planner can size with: speculative decoding and prefix caching.

Both change the service rate, and both are modelled where the service curve comes from:
the length mix (:class:`~velvetrope.planner.length_mix.LengthMix`), which both service models
(the closed-loop runs of the engine model and the analytic formula) take them from.
:func:`with_speculation` turns speculative decoding on in the profile (the batcher then
samples how many tokens each verification step emits, so the service time of a request is a
distribution, not a constant), from a per-token acceptance rate or from the measured
accepted tokens per step (vLLM's mean acceptance length);
:func:`prefix_caching_profile` turns automatic prefix caching on, and every request gets a
shared prefix of ``hit_rate`` of its prompt (one system prompt for the whole workload), so
that share of prompt tokens is served from the cache and its KV blocks are held once.
:func:`describe` says, in one line, what was assumed.  Bad values raise
:class:`~velvetrope.errors.PolicyError` naming the option.
"""

from __future__ import annotations

from velvetrope.engine.profile import EngineProfile
from velvetrope.engine.speculative import (
    acceptance_for_tokens_per_step,
    expected_tokens_per_step,
)
from velvetrope.errors import PolicyError

__all__ = ["DEFAULT_ACCEPTANCE", "describe", "prefix_caching_profile", "with_speculation"]

DEFAULT_ACCEPTANCE = 0.7
"""The per-token acceptance rate assumed when neither it nor the accepted tokens per step
is given."""


def with_speculation(
    profile: EngineProfile,
    tokens: int,
    acceptance: float | None = None,
    draft_ms: float = 0.0,
    *,
    accepted_per_step: float | None = None,
) -> EngineProfile:
    """``profile`` drafting ``tokens`` tokens per step, each accepted with ``acceptance``.

    ``accepted_per_step`` instead gives the measured mean tokens emitted per verification
    step (accepted drafts plus the target model's own token, vLLM's mean acceptance
    length), in ``[1, tokens + 1]``; it is turned into the acceptance rate with that mean
    (:func:`~velvetrope.engine.speculative.acceptance_for_tokens_per_step`).  The two are
    mutually exclusive; with neither, :data:`DEFAULT_ACCEPTANCE`.  ``draft_ms`` is the draft
    model's cost per draft token and step (milliseconds).  ``tokens == 0`` returns
    ``profile`` unchanged (speculation off).
    """
    if tokens < 0 or tokens > 16:
        raise PolicyError(f"--spec-tokens must be in [0, 16] (got {tokens})")
    if acceptance is not None and accepted_per_step is not None:
        raise PolicyError(
            "--spec-acceptance and --spec-accepted-per-step are mutually exclusive: give one"
        )
    if accepted_per_step is not None:
        if tokens == 0:
            raise PolicyError("--spec-accepted-per-step needs --spec-tokens >= 1")
        if not 1.0 <= accepted_per_step <= tokens + 1:
            raise PolicyError(
                f"--spec-accepted-per-step must be in [1, {tokens + 1}] (1 to --spec-tokens + 1) "
                f"(got {accepted_per_step:g})"
            )
        acceptance = acceptance_for_tokens_per_step(tokens, accepted_per_step)
    elif acceptance is None:
        acceptance = DEFAULT_ACCEPTANCE
    if not 0.0 <= acceptance <= 1.0:
        raise PolicyError(f"--spec-acceptance must be in [0, 1] (got {acceptance})")
    if draft_ms < 0.0:
        raise PolicyError(f"--spec-draft-ms must be >= 0 (got {draft_ms})")
    if tokens == 0:
        return profile
    return profile.with_overrides(
        spec_tokens=tokens, spec_acceptance=acceptance, spec_draft_step_s=draft_ms / 1000.0
    )


def prefix_caching_profile(profile: EngineProfile, hit_rate: float) -> EngineProfile:
    """``profile`` with prefix caching on when ``hit_rate > 0`` (``hit_rate`` in ``[0, 1)``)."""
    if not 0.0 <= hit_rate < 1.0:
        raise PolicyError(f"--prefix-hit-rate must be in [0, 1) (got {hit_rate})")
    return profile.with_overrides(enable_prefix_caching=True) if hit_rate > 0 else profile


def describe(profile: EngineProfile, hit_rate: float) -> str | None:
    """One line on the speculative decoding and prefix caching assumed, or ``None``."""
    parts: list[str] = []
    if profile.spec_tokens:
        k, a = profile.spec_tokens, profile.spec_acceptance
        parts.append(
            f"speculative decoding k={k} acceptance={a:.3g}: "
            f"{expected_tokens_per_step(k, a):.2f} tokens per verification step on average, "
            f"draft {profile.spec_draft_step_s * 1e3:g} ms per draft token"
        )
    if hit_rate > 0:
        parts.append(f"prefix cache: {hit_rate:.0%} of each prompt shared (one system prompt)")
    return "; ".join(parts) if parts else None
