"""Prefill backlog: the prompt tokens each engine has been sent and has not prefilled yet.

A request's first token comes once its engine has prefilled its prompt and, before it, the
prompts the engine schedules first: with the tier forwarded as the engine's ``priority``
(``ordered``), those of the same or a higher band (a lower band number) that are still
waiting for their first token; without it (a first-come engine), all of them.  Two engines
with the same number of requests in flight can be far apart there: one holding a dozen
7,000-token prompts of the top tier, the other a dozen short ones, or lower-tier ones its
priority scheduler serves after.  :class:`PrefillBacklog` keeps that sum per engine and per
band so that the replica choice (:func:`~velvetrope.core.routing.least_loaded`, ``ahead``)
sends a job where the least prefill stands before its own.

Only for a job whose tier has a TTFT objective (``timed``): a job with none (a batch tier
with an end-to-end objective only) gains nothing from an earlier first token, and sending
it to the engine with the fewest requests keeps the batches, and so the time per output
token, even across the engines (:meth:`PrefillBacklog.ahead` is 0 for it, and the load
decides).

**Accounting, per job.**  The owner (:class:`~velvetrope.core.saturation.EngineSaturation`)
calls :meth:`~PrefillBacklog.started` when a job is dispatched from the pool,
:meth:`~PrefillBacklog.sent` each time it is handed to an engine (again, to another, on a
retry: it moves), :meth:`~PrefillBacklog.prefilled` at its first token and
:meth:`~PrefillBacklog.ended` at its end, whatever the outcome; a job leaves the backlog at
the first of the last two, so nothing it counts can leak.  A response that is not streamed
says nothing of when its prompt was prefilled (its first token is its end), so it is not
counted.  Sans-IO: the counts are exact integers; the clock is the caller's ``now``.

**How long the backlog takes.**  Each first token also measures the engine's *prefill
rate*: the prompt tokens that reached their first token there per second over
``window_s`` (:class:`~velvetrope.core.event_rate.AmountRate`).  :meth:`PrefillBacklog.prefill_s`
is an engine's backlog over that rate: by Little's law, the time a prompt sent there now
waits for its prefill at the rate the engine has been prefilling, measured from the
gateway's own streams with no reading of the engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from velvetrope.core.event_rate import AmountRate
from velvetrope.core.job import Job

__all__ = ["PrefillBacklog"]


class PrefillBacklog:
    """Per engine and band, the prompt tokens sent there and not yet prefilled."""

    __slots__ = ("_engines", "_jobs", "_rates", "ordered", "timed", "window_s")

    def __init__(self, *, ordered: bool, timed: Iterable[str], window_s: float = 5.0) -> None:
        self.ordered = ordered
        """Whether the engines serve a lower band first (the tier is forwarded as their
        ``priority``): then only the job's band and those above it are ahead of it."""
        self.timed = frozenset(timed)
        """The tiers with a TTFT objective: the backlog decides only for their jobs."""
        self._jobs: dict[str, tuple[int, int, str | None]] = {}
        """A counted job's band, prompt tokens and engine (``None``: not sent yet)."""
        self._engines: dict[str, list[int]] = {}
        """An engine's backlog, indexed by band."""
        self.window_s = window_s
        """The window over which each engine's prefill rate is measured."""
        self._rates: dict[str, AmountRate] = {}
        """An engine's prompt tokens prefilled per second."""

    def started(self, job: Job) -> None:
        """``job`` was dispatched from the pool (counted once sent, if it is streamed)."""
        if job.streamed and job.prompt_tokens > 0:
            self._jobs[job.id] = (job.band, job.prompt_tokens, None)

    def sent(self, job_id: str, engine: str) -> None:
        """Job ``job_id`` was handed to ``engine``: its prompt waits there (and no longer
        where it was sent before, on a retry)."""
        entry = self._jobs.get(job_id)
        if entry is None:
            return
        band, tokens, prev = entry
        if prev is not None:
            self._engines[prev][band] -= tokens
        by_band = self._engines.get(engine)
        if by_band is None:
            by_band = self._engines[engine] = []
        if len(by_band) <= band:
            by_band.extend([0] * (band + 1 - len(by_band)))
        by_band[band] += tokens
        self._jobs[job_id] = (band, tokens, engine)

    def prefilled(self, job_id: str, now: float) -> None:
        """Job ``job_id`` produced its first token at ``now``: its prompt is no longer ahead
        of anyone, and its engine prefilled it (its prefill rate)."""
        entry = self._jobs.get(job_id)
        if entry is not None and entry[2] is not None:
            rate = self._rates.get(entry[2])
            if rate is None:
                rate = self._rates[entry[2]] = AmountRate(self.window_s)
            rate.add(now, entry[1])
        self.ended(job_id)

    def ended(self, job_id: str) -> None:
        """Job ``job_id`` reached its end (or its first token): take its prompt off."""
        entry = self._jobs.pop(job_id, None)
        if entry is None:
            return
        band, tokens, engine = entry
        if engine is not None:
            self._engines[engine][band] -= tokens

    def ahead(self, engine: str, job: Job) -> int:
        """The prompt tokens ``engine`` prefills before ``job``'s first token: those of
        its band and the bands above when ``ordered``, else of every band; 0 when its
        tier has no TTFT objective."""
        by_band = self._engines.get(engine)
        if by_band is None or job.tier not in self.timed:
            return 0
        if self.ordered:
            return sum(by_band[: job.band + 1])
        return sum(by_band)

    def tokens(self, engine: str) -> int:
        """Every prompt token ``engine`` has not prefilled yet, whatever the band."""
        by_band = self._engines.get(engine)
        return 0 if by_band is None else sum(by_band)

    def prefill_s(self, engine: str, now: float) -> float:
        """Seconds ``engine`` takes to prefill its backlog (:meth:`tokens`) at the rate it
        prefilled over the last ``window_s`` (module docstring); 0 with no backlog, or no
        rate measured yet (an unknown rate is not a busy engine)."""
        tokens = self.tokens(engine)
        rate = self._rates.get(engine)
        per_s = 0.0 if rate is None else rate.rate(now)
        return tokens / per_s if tokens > 0 and per_s > 0.0 else 0.0
