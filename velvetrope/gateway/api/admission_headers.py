"""The response headers that say what admission decided about a request.

* OpenAI's ``x-ratelimit-{limit,remaining,reset}-{tokens,requests}``, from the tenant's own
  buckets as the reservation left them (:func:`ratelimit_headers`); a rejection carries
  them too.
* ``x-velvetrope-queue-ms``: how long the request waited in the queue.
* ``x-velvetrope-pool`` and ``x-velvetrope-route`` (the rule that chose the pool), and for
  a degraded request ``x-velvetrope-degraded``: what was given up, e.g.
  ``max_tokens=50, pool=spare``, or for a budget spent (``on_exceeded: downgrade``)
  ``quota, tier=batch, pool=default`` (:func:`route_headers`).
* ``x-velvetrope-timing: arrived=A dispatched=D seq=S pid=P``, only when the environment variable
  ``VELVETROPE_TIMING_HEADER`` is ``1`` when this module is imported (a harness's switch,
  off by default: it shows the gateway's clock): the job's arrival in the admission
  controller and its dispatch, in seconds on the gateway's clock (:func:`time.monotonic`,
  which on Linux every process of a machine shares, so a client on the same machine can
  compare them with its own readings; Python's ``repr`` of each float, exact), ``S``
  its arrival's number in this process and ``P`` the process's id (the process whose queue
  and clock readings these are: a restarted gateway, or one of ``--workers``, is another).
  ``make chaos`` checks the queue's priority order with them.

:func:`dispatched_headers` is what an admitted request's response carries.  This module
imports nothing outside the core, so ``setup.py`` compiles it with mypyc: every admitted
request builds these headers.
"""

from __future__ import annotations

import os
from typing import Final

from velvetrope.core.bucket import BucketSnapshot
from velvetrope.core.job import Job
from velvetrope.core.quota import QUOTA_DOWNGRADE
from velvetrope.core.routing import FALLBACK_POOL, MAX_TOKENS

__all__ = [
    "TIMING_ENV",
    "TIMING_HEADER",
    "dispatched_headers",
    "duration",
    "ratelimit_headers",
    "route_headers",
]

Header = tuple[bytes, bytes]


def duration(seconds: float) -> bytes:
    """OpenAI's reset format: ``250ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{round(seconds * 1000) if seconds > 0 else 0}ms".encode()
    m, s = divmod(seconds, 60)
    return (f"{int(m)}m{s:.0f}s" if m >= 1 else f"{s:.3g}s").encode()


_RATELIMIT_NAMES: Final = {
    kind: (
        f"x-ratelimit-limit-{kind}".encode(),
        f"x-ratelimit-remaining-{kind}".encode(),
        f"x-ratelimit-reset-{kind}".encode(),
    )
    for kind in ("tokens", "requests")
}
_LIMIT_TEXT: Final[dict[float, bytes]] = {}
"""A bucket limit's header value, by limit (the configuration's few, so bounded)."""
_NO_WAIT: Final = duration(0.0)
_ZERO: Final = b"0"


def ratelimit_headers(snaps: tuple[BucketSnapshot, ...]) -> list[Header]:
    """OpenAI's ``x-ratelimit-*`` headers from the tenant's own buckets in ``snaps``."""
    out: list[Header] = []
    for snap in snaps:
        _, kind, owner, limit, left, reset = snap
        if owner != "tenant":
            continue
        limit_name, remaining_name, reset_name = _RATELIMIT_NAMES[kind]
        limit_text = _LIMIT_TEXT.get(limit)
        if limit_text is None:
            limit_text = str(int(limit)).encode()
            if len(_LIMIT_TEXT) < 1024:
                _LIMIT_TEXT[limit] = limit_text
        out.append((limit_name, limit_text))
        out.append((remaining_name, str(int(left)).encode() if left >= 1.0 else _ZERO))
        out.append((reset_name, _NO_WAIT if reset < 0.0005 else duration(reset)))
    return out


_ROUTE_HEADERS: Final[dict[tuple[str, str | None], tuple[Header, ...]]] = {}


def route_headers(job: Job) -> list[Header]:
    """``x-velvetrope-pool``, ``x-velvetrope-route`` and, for a degraded ``job``,
    ``x-velvetrope-degraded`` (see the module docstring)."""
    pool = job.pool
    rule = job.route
    key = (pool, rule)
    fixed = _ROUTE_HEADERS.get(key)
    if fixed is None:
        fixed = ((b"x-velvetrope-pool", pool.encode()),)
        if rule is not None:
            fixed += ((b"x-velvetrope-route", rule.encode()),)
        if len(_ROUTE_HEADERS) < 4096:  # pools x rules: bounded by the configuration
            _ROUTE_HEADERS[key] = fixed
    out = list(fixed)
    degraded = job.degraded
    if degraded:
        parts: list[str] = []
        for action in degraded:
            if action == QUOTA_DOWNGRADE:
                parts.insert(0, f"quota, tier={job.tier}, pool={pool}")
            elif action == MAX_TOKENS:
                parts.append(f"max_tokens={job.max_tokens // max(1, job.n)}")
            elif action == FALLBACK_POOL:
                parts.append(f"pool={pool}")
                if job.model is not None:
                    parts.append(f"model={job.model}")
        out.append((b"x-velvetrope-degraded", ", ".join(parts).encode()))
    return out


_QUEUE_MS: Final = b"x-velvetrope-queue-ms"
_NOT_QUEUED: Final = b"0.0"
TIMING_HEADER: Final = b"x-velvetrope-timing"
TIMING_ENV: Final = "VELVETROPE_TIMING_HEADER"
_WITH_TIMING: Final = os.environ.get(TIMING_ENV) == "1"
_PID: Final = f" pid={os.getpid()}"


def dispatched_headers(job: Job, snaps: tuple[BucketSnapshot, ...]) -> list[Header]:
    """The headers of an admitted (dispatched) ``job``'s response: its queue wait in
    milliseconds (one decimal), where it was routed, and its tenant's rate limits from
    ``snaps`` (and, when switched on, its timing: see the module docstring)."""
    dispatched = job.dispatched_at
    waited = 0.0 if dispatched is None else dispatched - job.arrival
    queued = f"{waited * 1000.0:.1f}".encode() if waited > 0.0 else _NOT_QUEUED
    out = [(_QUEUE_MS, queued)]
    if _WITH_TIMING:
        timing = f"arrived={job.arrival!r} dispatched={dispatched!r} seq={job.seq}{_PID}"
        out.append((TIMING_HEADER, timing.encode()))
    out += route_headers(job)
    if snaps:
        out += ratelimit_headers(snaps)
    return out
