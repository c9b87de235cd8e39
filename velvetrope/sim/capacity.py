"""The fleet's capacity for a workload, measured on the engine model: what ``--load 1.0`` means.

Method (:func:`replica_capacity`): a *closed-loop* run of one real
:class:`~velvetrope.engine.Batcher` kept at maximum concurrency.  ``concurrency`` sequences
(default: the profile's ``max_num_seqs``, the most the engine would ever take) are drawn with
replacement from the workload's (prompt, output) pairs; whenever one finishes, a fresh draw
replaces it at that instant, so the engine never runs dry and its own KV-cache limits
(head-of-line blocking, preemption by recompute) decide how many actually run.  After
``warmup`` completions (default: ``concurrency``, enough to replace the initial batch), the
next ``completions`` are timed; saturation throughput is their count over the virtual time
they took.  Because every replacement is a fresh draw from the mix, this is the completion
rate of the workload's own length mix, not of the length-biased mix that sits in a batch.

The fleet's capacity (:func:`fleet_capacity`) is that rate times the number of replicas: a
router that spreads load evenly reaches it, and arrivals faster than it make queues grow
without bound.  Requests the engine cannot hold (``prompt + output > max_model_len``) are left
out of the draw, and a zero-token output counts as one token, as in the simulator.
Deterministic: the same seed gives the same number.  Results are memoised per
(profile, length mix, parameters), so a sweep measures once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from velvetrope.engine import Batcher, EngineProfile, Finished
from velvetrope.errors import PolicyError
from velvetrope.sim.trace_request import TraceRequest

__all__ = ["Capacity", "fleet_capacity", "replica_capacity"]

_CACHE: dict[tuple[object, ...], float] = {}


@dataclass(frozen=True, slots=True)
class Capacity:
    """Saturation throughput: ``per_replica_rps`` × ``replicas`` = ``rps`` requests/s."""

    per_replica_rps: float
    replicas: int

    @property
    def rps(self) -> float:
        return self.per_replica_rps * self.replicas


def replica_capacity(
    profile: EngineProfile,
    workload: Sequence[TraceRequest],
    *,
    concurrency: int | None = None,
    completions: int = 3000,
    warmup: int | None = None,
    seed: int = 0,
) -> float:
    """Saturation throughput of one replica, in requests per second (see the module docstring)."""
    c = profile.max_num_seqs if concurrency is None else concurrency
    w = c if warmup is None else warmup
    if c < 1 or completions < 1 or w < 0:
        raise PolicyError("concurrency and completions must be >= 1, warmup >= 0")
    pairs = [
        (r.prompt_tokens, max(1, r.output_tokens))
        for r in workload
        if r.prompt_tokens + max(1, r.output_tokens) <= profile.max_model_len
    ]
    if not pairs:
        raise PolicyError("no request of the workload fits the engine's max_model_len")
    arr = np.asarray(pairs, dtype=np.int64)
    digest = hashlib.sha256(arr.tobytes()).hexdigest()
    key = (profile, digest, c, completions, w, seed)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    rng = np.random.default_rng(seed)
    draws: list[int] = []
    prompts = arr[:, 0].tolist()
    outputs = arr[:, 1].tolist()
    b = Batcher(profile, token_events=False)
    nxt = 0

    def add(now: float) -> None:
        nonlocal nxt
        if nxt >= len(draws):
            draws.extend(rng.integers(0, len(arr), size=c + completions).tolist())
        j = draws[nxt]
        b.add(str(nxt), prompts[j], outputs[j], now)
        nxt += 1

    for _ in range(c):
        add(0.0)
    t = 0.0
    done = 0
    t_start = 0.0
    while done < w + completions:
        res = b.step(t)
        t = res.start + res.duration
        for e in res.events:
            if type(e) is Finished:
                done += 1
                if done == w:
                    t_start = t
                add(t)
    rate = completions / (t - t_start)
    _CACHE[key] = rate
    return rate


def fleet_capacity(
    profile: EngineProfile, workload: Sequence[TraceRequest], replicas: int, *, seed: int = 0
) -> Capacity:
    """Capacity of ``replicas`` identical replicas for ``workload``'s length mix."""
    if replicas < 1:
        raise PolicyError(f"replicas must be >= 1, got {replicas}")
    return Capacity(replica_capacity(profile, workload, seed=seed), replicas)
