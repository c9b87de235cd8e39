"""The engine model: a sans-IO continuous batcher over a paged KV cache, and its profiles.

:class:`Batcher` models one inference engine (vLLM v1's scheduler: chunked prefill,
``max_num_seqs``, a token budget per iteration, paged KV blocks, preemption by recompute,
automatic prefix caching, speculative decoding);
it is stepped with timestamps, never reads a clock and does no I/O.  An
:class:`EngineProfile` says how long an iteration takes and how large the engine is; the
built-ins (:func:`list_profiles`) ship as YAML in ``velvetrope/engine/profiles``.

The simulator steps a :class:`Batcher` in virtual time; the engine server
(:mod:`velvetrope.engine.serve`) steps one in real time behind an OpenAI-compatible API.
This package and its model modules (``batcher``, ``kvcache``, ``profile``, ``outputs``) and
calibration's pure part (:mod:`velvetrope.engine.calibrate`) import no HTTP library; the
server and calibration's client (:mod:`velvetrope.engine.calibrate.client`) are the HTTP
side, imported by name.
"""

from velvetrope.engine.batcher import (
    Batcher,
    EngineEvent,
    Finished,
    FirstToken,
    Preempted,
    SeqState,
    StepResult,
    Tokens,
)
from velvetrope.engine.kvcache import BlockAllocator
from velvetrope.engine.prefix_cache import PrefixCachingAllocator
from velvetrope.engine.profile import EngineProfile, list_profiles, load_profile, profile_to_yaml

__all__ = [
    "Batcher",
    "BlockAllocator",
    "EngineEvent",
    "EngineProfile",
    "Finished",
    "FirstToken",
    "Preempted",
    "PrefixCachingAllocator",
    "SeqState",
    "StepResult",
    "Tokens",
    "list_profiles",
    "load_profile",
    "profile_to_yaml",
]
