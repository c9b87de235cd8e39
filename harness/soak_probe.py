"""What the soak samples, and how: the gateway process, its ``/metrics`` and its Redis.

One :class:`Sample` every ``sample_s`` (:meth:`Probe.sample`):

* ``rss_mb``: the gateway process's resident set (``VmRSS`` of ``/proc/<pid>/status``), the
  process that serves: ``velvetrope serve`` with one worker serves in the process it was
  started as (no fork, no launcher), which :meth:`Probe.check_serving_process` verifies;
* ``fds``: the file descriptors it holds (``/proc/<pid>/fd``);
* ``tasks``: the tasks alive in its event loop (``velvetrope_asyncio_tasks`` on its
  ``/metrics``, counted at scrape time);
* ``in_flight``, ``queued``: ``velvetrope_in_flight`` and ``velvetrope_queue_depth`` summed
  over pools and bands, from the same scrape;
* ``redis_keys``: ``DBSIZE``; ``redis_memory_mb``: ``INFO memory`` ``used_memory``;
* the load so far, from the load generator's
  :class:`~velvetrope.demo.replay_results.LiveCounters`: requests sent, finished,
  completed, rejected, hung up on purpose, and client-side errors (error answers, failed
  connections, timeouts; a rejection's code is not known yet here, so the final count,
  :class:`~harness.soak_load.Tally`, may be higher).

A value that could not be read (a scrape timed out under load) is ``nan``: the trend fits
leave it out and the CSV shows it empty.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import astuple, dataclass, fields
from typing import Any, Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from velvetrope.demo.replay_results import LiveCounters
from velvetrope.serving.launch import open_fds, vm_rss_mb

__all__ = ["COLUMNS", "SERIES", "Probe", "Sample", "metric_sums"]

SERIES: Final = ("rss_mb", "fds", "tasks", "redis_keys", "redis_memory_mb")
"""The sampled series whose trend the verdict judges."""

_NAN: Final = math.nan


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample; ``t_s`` is seconds since the load started."""

    t_s: float
    rss_mb: float
    fds: float
    tasks: float
    redis_keys: float
    redis_memory_mb: float
    in_flight: float
    queued: float
    sent: int
    finished: int
    completed: int
    rejected: int
    hung_up: int
    client_errors: int

    def row(self) -> list[str]:
        """The CSV row: numbers as Python writes them, ``nan`` as an empty cell."""
        return ["" if isinstance(v, float) and math.isnan(v) else f"{v:g}" for v in astuple(self)]


COLUMNS: Final = tuple(f.name for f in fields(Sample))
"""The CSV's header."""


def metric_sums(
    text: str, names: Iterable[str], label: str = "outcome"
) -> dict[tuple[str, str], float]:
    """The samples named ``names`` (``velvetrope_requests_total``, not the family's name) in
    Prometheus ``text``, summed by (sample name, the sample's ``label`` or ``""``)."""
    wanted = set(names)
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name not in wanted:
                continue
            key = (s.name, s.labels.get(label, ""))
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


@dataclass(slots=True)
class Probe:
    """Reads one gateway (its PID and URL) and one Redis (an asyncio redis-py client)."""

    pid: int
    gateway_url: str
    session: aiohttp.ClientSession
    redis: Any

    def check_serving_process(self) -> None:
        """RuntimeError unless ``pid`` is alive, childless, and holds a listening socket for
        the gateway's port: the process whose memory and files are the gateway's."""
        children = [
            c
            for tid in _listdir(f"/proc/{self.pid}/task")
            for c in _read(f"/proc/{self.pid}/task/{tid}/children").split()
        ]
        if children:
            raise RuntimeError(f"gateway pid {self.pid} has children {children}: not one worker")
        port = int(self.gateway_url.rsplit(":", 1)[1])
        inodes = _listening_inodes(port)
        mine = {
            os_link
            for fd in _listdir(f"/proc/{self.pid}/fd")
            if (os_link := _readlink(f"/proc/{self.pid}/fd/{fd}")).startswith("socket:[")
        }
        if not inodes & mine:
            raise RuntimeError(f"pid {self.pid} does not hold the socket listening on {port}")

    async def scrape(self) -> str | None:
        """The gateway's ``/metrics`` text, or ``None`` if it did not answer (5 s)."""
        try:
            async with self.session.get(
                self.gateway_url + "/metrics", timeout=aiohttp.ClientTimeout(total=5.0)
            ) as r:
                return await r.text() if r.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def _redis(self) -> tuple[float, float]:
        try:
            keys = float(await self.redis.dbsize())
            mem = float((await self.redis.info("memory"))["used_memory"]) / 2**20
        except Exception:  # any redis-py or socket error: the sample shows a gap
            return _NAN, _NAN
        return keys, mem

    async def sample(self, t_s: float, live: LiveCounters) -> Sample:
        """One :class:`Sample` (module docstring) at ``t_s``."""
        try:
            rss, fds = vm_rss_mb(self.pid), float(open_fds(self.pid))
        except (OSError, RuntimeError):
            rss = fds = _NAN
        text = await self.scrape()
        got: Mapping[tuple[str, str], float] = (
            metric_sums(
                text, ("velvetrope_asyncio_tasks", "velvetrope_in_flight", "velvetrope_queue_depth")
            )
            if text is not None
            else {}
        )
        keys, mem = await self._redis()
        return Sample(
            t_s=t_s,
            rss_mb=rss,
            fds=fds,
            tasks=got.get(("velvetrope_asyncio_tasks", ""), _NAN),
            redis_keys=keys,
            redis_memory_mb=mem,
            in_flight=got.get(("velvetrope_in_flight", ""), _NAN),
            queued=got.get(("velvetrope_queue_depth", ""), _NAN),
            sent=live.sent,
            finished=live.finished,
            completed=live.completed,
            rejected=sum(live.rejected.values()),
            hung_up=live.hung_up,
            client_errors=live.errors + live.failed + live.timeouts,
        )


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _listening_inodes(port: int) -> set[str]:
    """``socket:[inode]`` of the TCP sockets listening on ``port`` (``/proc/net/tcp``, 6)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(table).splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{cols[9]}]")
    return found
