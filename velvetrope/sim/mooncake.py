"""Mooncake's trace format: requests with the hashes of their prompts' 512-token blocks.

The Mooncake traces (kvcache-ai/Mooncake, ``FAST25-release/traces/``, Apache License 2.0;
Qin et al., "Mooncake: Trading More Storage for Less Computation — A KVCache-centric
Architecture for Serving LLM Chatbot", FAST 2025) hold one JSON object a line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

``timestamp`` is milliseconds from the start (non-decreasing), ``input_length`` and
``output_length`` are tokens, and ``hash_ids`` are remapped hashes of the prompt's blocks of
:data:`MOONCAKE_BLOCK_TOKENS` tokens, the last one possibly partial: equal ids at the same
position mean the same prefix up to the end of that block (its KV cache can be reused).
:func:`read_mooncake` turns each line into a :class:`~velvetrope.sim.trace_request.TraceRequest`
with ``t`` in seconds, the ``hash_ids`` as its ``block_hashes`` and ``block_tokens = 512``
(tenant ``"default"``, no tier, no ``max_tokens``).  A request needs at least one prompt token;
a record with ``input_length`` 0 is refused like any other malformed one.  Every problem
raises :class:`~velvetrope.errors.TraceError` naming ``<file>:<line>:``.

The conversation trace ships as the built-in trace ``mooncake_conv`` (see
``velvetrope/data/traces/README.md``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from velvetrope.errors import PolicyError, TraceError
from velvetrope.sim.trace_request import TraceRequest

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "MOONCAKE_KEYS",
    "is_mooncake_record",
    "parse_mooncake",
    "read_mooncake",
]

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per block of Mooncake's ``hash_ids``."""

MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
"""The keys of a Mooncake record (all required, nothing else)."""


def is_mooncake_record(obj: object) -> bool:
    """Whether a decoded JSON line looks like a Mooncake record (has ``hash_ids`` and
    ``timestamp``): how :func:`~velvetrope.sim.traces.load_trace` tells the formats apart."""
    return isinstance(obj, dict) and "hash_ids" in obj and "timestamp" in obj


def _int(obj: dict[str, Any], key: str) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key!r} must be an integer, got {v!r}")
    return v


def _request(obj: object) -> TraceRequest:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    keys = set(obj)
    if keys != MOONCAKE_KEYS:
        missing = sorted(MOONCAKE_KEYS - keys)
        unknown = sorted(keys - MOONCAKE_KEYS)
        raise ValueError(f"Mooncake record: missing {missing}, unknown {unknown}")
    ts = _int(obj, "timestamp")
    hashes = obj["hash_ids"]
    if not isinstance(hashes, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in hashes
    ):
        raise ValueError(f"'hash_ids' must be a list of integers, got {hashes!r}")
    if ts < 0:
        raise ValueError(f"'timestamp' must be >= 0, got {ts}")
    try:
        return TraceRequest(
            ts / 1000.0,
            _int(obj, "input_length"),
            _int(obj, "output_length"),
            block_hashes=tuple(hashes),
            block_tokens=MOONCAKE_BLOCK_TOKENS,
        )
    except PolicyError as e:
        raise ValueError(str(e)) from None


def parse_mooncake(lines: Iterable[bytes], path: str | Path) -> list[TraceRequest]:
    """The requests of Mooncake-format byte ``lines`` (``path`` names them in errors).
    Timestamps must not decrease (a disordered file is refused, not sorted)."""
    out: list[TraceRequest] = []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            req = _request(json.loads(raw))
        except (ValueError, UnicodeDecodeError) as e:
            raise TraceError(f"{path}:{lineno}: {e}") from None
        if out and req.t < out[-1].t:
            raise TraceError(
                f"{path}:{lineno}: timestamp goes back ({req.t} s after {out[-1].t} s)"
            )
        out.append(req)
    return out


def read_mooncake(path: str | Path) -> list[TraceRequest]:
    """Read a Mooncake trace file (gzipped if its name ends in ``.gz``)."""
    p = Path(path)
    try:
        with gzip.open(p, "rb") if p.name.endswith(".gz") else p.open("rb") as f:
            return parse_mooncake(f, p)
    except (OSError, EOFError) as e:
        raise TraceError(f"{p}: cannot read: {e}") from e
