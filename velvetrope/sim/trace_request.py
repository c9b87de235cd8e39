"""The request record of a workload: :class:`TraceRequest`, and its columns as arrays.

A workload is a plain ``list[TraceRequest]`` sorted by arrival time ``t``; the simulator and
the demo's load generator consume it.  A bad field raises
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray

from velvetrope import checks
from velvetrope.core.kinds import PROMPT_ONLY, SIMULATED
from velvetrope.errors import PolicyError

__all__ = ["FloatArray", "IntArray", "TraceRequest", "request_columns"]

IntArray: TypeAlias = NDArray[np.int64]
FloatArray: TypeAlias = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload: when it arrives, how big it is, whose it is.

    ``t`` is the arrival time in seconds from the start of the workload (finite, ``>= 0``):
    an Azure CSV trace is rebased so that its first row is at ``0.0``; a JSONL file keeps the
    times it holds; synthetic arrivals start after 0.  ``prompt_tokens >= 1``;
    ``output_tokens >= 0`` is the true output length, what the engine will generate (``0`` is
    a prefill-only request, which some traces record).
    ``max_tokens`` is the declared ``max_tokens`` (``None``: not declared); when declared it is
    ``>= 1`` and ``>= output_tokens``, since an engine stops at ``max_tokens``.  ``tenant`` is a
    non-empty name, ``tier`` a non-empty name or ``None`` (the tenant's configured tier).
    ``prefix_id``/``prefix_tokens``: the first ``prefix_tokens`` prompt tokens are the shared
    prefix ``prefix_id`` (a system prompt; reused by an engine with prefix caching);
    ``0 <= prefix_tokens <= prompt_tokens``, and a positive count needs an id.  ``model`` is
    the requested model (``None``: unnamed; routing rules on models see it).
    ``block_hashes``/``block_tokens``: the prompt's leading blocks of ``block_tokens`` tokens
    each, as chained hashes (equal hash at the same position: the same prefix up to the end
    of that block, as in Mooncake's ``hash_ids``); prefix-aware routing keys on them and an
    engine with prefix caching reuses them.  Hashes need ``block_tokens >= 1``.
    ``endpoint`` is the endpoint kind (:data:`~velvetrope.core.kinds.SIMULATED`: ``chat``, the
    default, ``completions``, ``responses``, ``messages``, ``embeddings`` or ``rerank``);
    a prompt-only kind (``embeddings``, ``rerank``) has ``output_tokens`` 0 and no
    ``max_tokens``, and is admitted as the gateway admits it
    (:func:`~velvetrope.core.kinds.size_prompt_only`).

    Construction validates and normalises (numpy scalars become ``int``/``float``); a bad field
    raises :class:`~velvetrope.errors.PolicyError`.
    """

    t: float
    prompt_tokens: int
    output_tokens: int
    tenant: str = "default"
    tier: str | None = None
    max_tokens: int | None = None
    prefix_id: str | None = None
    prefix_tokens: int = 0
    model: str | None = None
    block_hashes: tuple[int, ...] = ()
    block_tokens: int = 0
    endpoint: str = "chat"

    def __post_init__(self) -> None:
        t = self.t
        if isinstance(t, bool) or not isinstance(t, int | float):
            raise PolicyError(f"t must be a number of seconds, got {t!r}")
        try:
            t = float(t)
        except OverflowError:
            t = math.inf
        if not (math.isfinite(t) and t >= 0.0):
            raise PolicyError(f"t must be finite and >= 0, got {self.t!r}")
        object.__setattr__(self, "t", t)
        object.__setattr__(
            self, "prompt_tokens", checks.count("prompt_tokens", self.prompt_tokens, 1)
        )
        output = checks.count("output_tokens", self.output_tokens, 0)
        object.__setattr__(self, "output_tokens", output)
        if not isinstance(self.tenant, str) or not self.tenant:
            raise PolicyError(f"tenant must be a non-empty string, got {self.tenant!r}")
        if self.tier is not None and (not isinstance(self.tier, str) or not self.tier):
            raise PolicyError(f"tier must be a non-empty string or None, got {self.tier!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise PolicyError(f"model must be a non-empty string or None, got {self.model!r}")
        if self.max_tokens is not None:
            cap = checks.count("max_tokens", self.max_tokens, 1)
            if output > cap:
                raise PolicyError(f"output_tokens ({output}) exceeds max_tokens ({cap})")
            object.__setattr__(self, "max_tokens", cap)
        shared = checks.count("prefix_tokens", self.prefix_tokens, 0)
        if shared > self.prompt_tokens or (shared and not self.prefix_id):
            raise PolicyError(
                f"prefix_tokens ({shared}) must be <= prompt_tokens ({self.prompt_tokens}) "
                f"and need a non-empty prefix_id (got {self.prefix_id!r})"
            )
        object.__setattr__(self, "prefix_tokens", shared)
        if self.endpoint not in SIMULATED:
            raise PolicyError(
                f"endpoint must be one of {', '.join(SIMULATED)}, got {self.endpoint!r}"
            )
        if self.endpoint in PROMPT_ONLY and (output or self.max_tokens is not None):
            raise PolicyError(
                f"a {self.endpoint} request is prompt-only: output_tokens must be 0 and "
                f"max_tokens null (got {output}, {self.max_tokens})"
            )
        if self.block_hashes or self.block_tokens:
            hashes = self.block_hashes
            if not isinstance(hashes, tuple) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes
            ):
                raise PolicyError(f"block_hashes must be a tuple of integers, got {hashes!r}")
            checks.count("block_tokens", self.block_tokens, 1 if hashes else 0)


def request_columns(requests: Sequence[TraceRequest]) -> tuple[FloatArray, IntArray, IntArray]:
    """Arrival times, prompt lengths and output lengths of ``requests``, as arrays."""
    n = len(requests)
    t = np.fromiter((r.t for r in requests), dtype=np.float64, count=n)
    p = np.fromiter((r.prompt_tokens for r in requests), dtype=np.int64, count=n)
    o = np.fromiter((r.output_tokens for r in requests), dtype=np.int64, count=n)
    return t, p, o
