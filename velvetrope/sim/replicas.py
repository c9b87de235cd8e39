"""Replicas that come and go: start-up delays, and one pool's replicas as Kubernetes sees them.

A replica the autoscaler asks for is **starting** for a start-up delay (:class:`StartupDelay`:
image pull, weights load, CUDA graphs: the seeds' 90-180 s for a GPU replica), then
**ready** (it serves), then, when the autoscaler scales down, **draining** (the gateway sends
it nothing new, it finishes what it runs) and finally **gone**.  A starting replica that is
scaled away before it is ready is gone at once.  Every replica costs GPU time from the moment
it is asked for until it is gone: the GPU is held while the model loads and while it drains.

Which replicas a scale-down takes (:meth:`ReplicaPool.scale`) follows the ReplicaSet
controller's deletion ranking (``getPodsToDelete``/``ActivePodsWithRanks``): pods that are
not ready go before ready ones, and among equals the one that has been ready (or existed)
for the shortest time goes first — here: starting replicas newest first, then ready ones
most recently ready first (the higher number first among equals: the newer pod).  Which
replica takes a request is the fleet's business (only
ready replicas are offered to the router).

The simulator's loop owns the timing: it creates the replicas' engines, schedules each
start-up's end, and tells the pool when a draining replica has finished its work.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from velvetrope.errors import PolicyError

__all__ = ["Replica", "ReplicaPool", "ReplicaState", "StartupDelay"]


@dataclass(frozen=True, slots=True)
class StartupDelay:
    """Seconds from being asked for to serving: ``fixed`` (``a``), ``uniform`` on ``[a, b]``,
    or ``lognormal`` with median ``a`` and log-standard deviation ``b``.

    Parsed from ``"120"``, ``"90-180"`` or ``"lognormal:120:0.3"`` (:meth:`parse`).
    """

    kind: str
    a: float
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise PolicyError(f"unknown start-up delay kind {self.kind!r}")
        for name, v in (("a", self.a), ("b", self.b)):
            if not (math.isfinite(v) and v >= 0):
                raise PolicyError(f"start-up delay {name} must be finite and >= 0, got {v!r}")
        if self.kind == "uniform" and self.b < self.a:
            raise PolicyError(f"start-up range {self.a:g}-{self.b:g} is empty")
        if self.kind == "lognormal" and self.a <= 0:
            raise PolicyError("a lognormal start-up delay needs a median > 0")

    @classmethod
    def parse(cls, text: str) -> StartupDelay:
        """``"120"``, ``"90-180"`` or ``"lognormal:MEDIAN:SIGMA"`` (seconds)."""
        t = text.strip()
        try:
            if t.startswith("lognormal:"):
                _, med, sigma = t.split(":")
                return cls("lognormal", float(med), float(sigma))
            if "-" in t:
                lo, hi = t.split("-")
                return cls("uniform", float(lo), float(hi))
            return cls("fixed", float(t))
        except ValueError:
            raise PolicyError(
                f"bad start-up delay {text!r}: expected SECONDS, LO-HI or lognormal:MEDIAN:SIGMA"
            ) from None

    def draw(self, rng: np.random.Generator) -> float:
        """One delay (``fixed`` draws nothing from ``rng``)."""
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return float(rng.uniform(self.a, self.b))
        return float(self.a * math.exp(self.b * rng.standard_normal()))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g} s"
        if self.kind == "uniform":
            return f"uniform {self.a:g}-{self.b:g} s"
        return f"lognormal, median {self.a:g} s, σ {self.b:g}"


class ReplicaState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"


@dataclass(slots=True)
class Replica:
    """One replica: ``slot`` is its engine's number in the fleet."""

    slot: int
    asked_at: float
    ready_at: float
    state: ReplicaState = ReplicaState.STARTING
    drain_at: float | None = None
    gone_at: float | None = None


class ReplicaPool:
    """One pool's replicas (see the module docstring).

    ``new_slot()`` gives a fresh engine slot for each replica asked for; the pool draws its
    start-up delay from ``rng``.  :attr:`samples` holds ``(t, asked, ready)`` after every
    change: ``asked`` is what Kubernetes counts (starting + ready, not draining), ``ready``
    what serves.
    """

    __slots__ = ("delay", "new_slot", "replicas", "rng", "samples")

    def __init__(
        self, delay: StartupDelay, rng: np.random.Generator, new_slot: Callable[[], int]
    ) -> None:
        self.delay = delay
        self.rng = rng
        self.new_slot = new_slot
        self.replicas: list[Replica] = []
        self.samples: list[tuple[float, int, int]] = []

    def add_ready(self, now: float, n: int) -> list[Replica]:
        """``n`` new replicas that are up from the start (the fleet before any scaling)."""
        return self.adopt(now, [self.new_slot() for _ in range(n)])

    def adopt(self, now: float, slots: list[int]) -> list[Replica]:
        """Replicas already up in these engine slots (a fleet built beforehand)."""
        out = [Replica(k, now, now, ReplicaState.READY) for k in slots]
        self.replicas.extend(out)
        self._sample(now)
        return out

    def _in(self, *states: ReplicaState) -> list[Replica]:
        return [r for r in self.replicas if r.state in states]

    @property
    def asked(self) -> int:
        """Starting + ready (the Deployment's replicas; draining ones are terminating)."""
        return len(self._in(ReplicaState.STARTING, ReplicaState.READY))

    @property
    def ready(self) -> int:
        return len(self._in(ReplicaState.READY))

    def scale(self, now: float, target: int) -> tuple[list[Replica], list[Replica]]:
        """Move to ``target`` asked replicas; returns ``(started, drained)``: the replicas
        asked for (their ``ready_at`` drawn) and the ready ones now draining.  Starting
        replicas scaled away are gone at once."""
        if target < 0:
            raise PolicyError(f"target replicas must be >= 0, got {target}")
        started: list[Replica] = []
        drained: list[Replica] = []
        have = self.asked
        for _ in range(target - have):
            r = Replica(self.new_slot(), now, now + self.delay.draw(self.rng))
            self.replicas.append(r)
            started.append(r)
        if target < have:
            newest = self._in(ReplicaState.STARTING)
            starting = sorted(newest, key=lambda r: (r.asked_at, r.slot), reverse=True)
            ready = sorted(
                self._in(ReplicaState.READY), key=lambda r: (r.ready_at, r.slot), reverse=True
            )
            for r in (starting + ready)[: have - target]:
                if r.state is ReplicaState.STARTING:
                    r.state, r.gone_at = ReplicaState.GONE, now
                else:
                    r.state, r.drain_at = ReplicaState.DRAINING, now
                    drained.append(r)
        self._sample(now)
        return started, drained

    def become_ready(self, r: Replica, now: float) -> bool:
        """``r``'s start-up ended at ``now``; False if it was scaled away meanwhile."""
        if r.state is not ReplicaState.STARTING:
            return False
        r.state, r.ready_at = ReplicaState.READY, now
        self._sample(now)
        return True

    def leave(self, r: Replica, now: float) -> None:
        """A draining ``r`` has finished its work and leaves."""
        if r.state is not ReplicaState.DRAINING:
            raise PolicyError(f"replica {r.slot} is {r.state.value}, not draining")
        r.state, r.gone_at = ReplicaState.GONE, now
        self._sample(now)

    def gpu_seconds(self, until: float) -> float:
        """Replica-seconds held, from being asked for to gone (or ``until``)."""
        return sum(
            (r.gone_at if r.gone_at is not None else until) - r.asked_at for r in self.replicas
        )

    def _sample(self, now: float) -> None:
        s = (now, self.asked, self.ready)
        if self.samples and self.samples[-1][0] == now:
            self.samples[-1] = s
        else:
            self.samples.append(s)
