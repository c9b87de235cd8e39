"""The length mix of a workload fitted to one engine: the iterations each request needs.

:class:`LengthMix` is what both service models (:mod:`velvetrope.planner.service_methods`)
take from the workload and the engine's features: the (prompt, output) pairs cut to the
engine's ``max_model_len``, each one's prefill and decode iterations, the prompt tokens
prefix caching spares it, the verification steps speculative decoding takes, and the KV
tokens it attends to.  Units: tokens and iterations.  Bad arguments raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from velvetrope.engine.profile import EngineProfile
from velvetrope.engine.speculative import steps_moments
from velvetrope.errors import PolicyError

__all__ = ["LengthMix"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


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
