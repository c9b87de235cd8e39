"""The request side of the simulator's event loop (:mod:`velvetrope.sim.runner`): the
workload's requests through the request machine
(:class:`~velvetrope.core.request_machine.RequestMachine`), as the gateway's driver feeds it.

An arrival is made a :class:`~velvetrope.core.Job` and reserved in the in-memory store
(which answers without I/O); a step end's events are delivered (``FirstToken``, then each
``Finished`` with what it lets go); a client timeout ends a queued or dispatched job; and
the machine's effects are carried out in order: ``Send`` to a replica's batcher (a job too
long, or with no engine to take it, fails at once), ``Cancel`` aborts there, ``Settle``
into the store.  A degraded job's capped ``max_tokens`` caps what its engine generates.
Nothing here schedules an event or sets the clock: the loop does both before it calls in.
"""

from __future__ import annotations

from typing import Final

from velvetrope.core import Job, JobState, Reason, Usage
from velvetrope.core.effects import Cancel, Effect, Reserve, Send, Settle
from velvetrope.core.kinds import PROMPT_ONLY, size_prompt_only
from velvetrope.core.request_machine import RequestMachine
from velvetrope.core.tuples import new_tuple
from velvetrope.engine import EngineEvent, Finished, FirstToken
from velvetrope.sim.drive_inputs import Inputs, LogEntry
from velvetrope.sim.fleet import Fleet
from velvetrope.sim.replica_steps import BY_ALL, ReplicaSteps
from velvetrope.sim.scrape import EngineScrapes
from velvetrope.store.memory import MemoryStore

__all__ = ["RequestSide"]

_QUEUED: Final = JobState.QUEUED
_DISPATCHED: Final = JobState.DISPATCHED


class RequestSide:
    """The workload's requests (``inp``, in arrival order) through ``machine``, ``store``
    holding the buckets, sent to the replicas of ``fleet`` (whose step ends ``steps``
    keeps) as ``scrapes`` routes them; see the module docstring.  ``timeout``: the
    client timeout (``None``: none); with ``record``, each decision is appended to
    ``decisions``."""

    def __init__(
        self,
        machine: RequestMachine,
        store: MemoryStore,
        fleet: Fleet,
        scrapes: EngineScrapes,
        steps: ReplicaSteps,
        inp: Inputs,
        *,
        timeout: float | None,
        decisions: list[LogEntry],
        record: bool,
    ) -> None:
        self.machine = machine
        self.ctl = machine.ctl
        self.store = store
        self.fleet = fleet
        self.scrapes = scrapes
        self.steps = steps
        self.timeout = timeout
        self.decisions = decisions
        self.record = record
        self.n = len(inp.times)
        self.times, self.prompts, self.outputs = inp.times, inp.prompts, inp.outputs
        self.inp = inp
        self.jobs: list[Job | None] = [None] * self.n
        self.replica_of = [-1] * self.n
        """Each request's replica, once sent."""
        self.req_pool = [0] * self.n
        """Each request's pool number, once it arrived."""
        self.batchers = fleet.batchers
        self.load = fleet.load
        self.active = fleet.active
        self.members = fleet.members
        self.fresh = scrapes.fresh
        self.preempts = any(
            p.get("preemptions") is not None for p in self.ctl.status()["pools"].values()
        )
        self.samples_t: list[float] = []
        self.samples_q: list[int] = []
        self.samples_f: list[int] = []
        self.arrived = 0
        """How many requests have arrived (the workload is in arrival order)."""
        self.waiting = 0
        """The first arrival whose client timeout is pending."""

    def work_left(self) -> bool:
        """Whether requests are still to come, queued or in flight."""
        return bool(self.arrived < self.n or self.ctl.queued or self.ctl.in_flight)

    def next_timeout(self) -> float | None:
        """When the earliest client timeout pending is due (``None``: none is)."""
        if self.timeout is not None and self.waiting < self.arrived:
            return self.times[self.waiting] + self.timeout
        return None

    def arrive(self, i: int, now: float) -> None:
        """Request ``i`` arrives at ``now``: the machine decides (its reservation answered
        by the store at once), then its effects are carried out and the queue sampled."""
        job = self._job(i)
        machine = self.machine
        self.jobs[i] = job
        machine.arrived(job)
        todo = machine.effects()
        decided = job.state
        while todo and type(todo[0]) is Reserve:  # the same store, answering without I/O
            claims = todo[0].claims
            machine.reserved(job, claims, self.store.reserve_now(job.id, job.tenant, claims))
            decided = job.state  # before what the decision lets go
            todo = machine.effects()
        self.req_pool[i] = self.inp.pool_index[job.pool]
        if job.max_tokens < self.outputs[i]:  # degraded: the engine stops at the cap
            self.outputs[i] = job.max_tokens
        if self.record:
            self.decisions.append((now, "arrive", job.id, _detail(job, decided)))
        self.apply(now, BY_ALL, todo)
        self.samples_t.append(now)
        self.samples_q.append(self.ctl.queued)
        self.samples_f.append(self.ctl.in_flight)
        self.arrived = i + 1

    def _job(self, i: int) -> Job:
        """Request ``i`` as the gateway makes it a job (a prompt-only kind sized so)."""
        inp = self.inp
        job = Job(
            str(i),
            inp.tenants[i],
            inp.tiers[i],
            self.prompts[i],
            inp.caps[i],
            model=inp.models[i],
            predicted_output=inp.preds[i],
            template=inp.templates[i],  # a shared system prompt: the template
        )
        if inp.kinds:
            job.kind = inp.kinds[i]
            if job.kind in PROMPT_ONLY:
                size_prompt_only(job)
        return job

    def time_out(self, now: float) -> None:
        """End every job whose client timeout is due by ``now`` (queued: it leaves the
        queue; dispatched: aborted at its replica, charged what it generated), each
        followed by what it lets go."""
        timeout = self.timeout
        assert timeout is not None
        j = self.waiting
        while j < self.arrived and self.times[j] + timeout <= now:
            job = self.jobs[j]
            assert job is not None
            if job.state is _QUEUED:
                self.machine.client_gone(job)
            elif job.state is _DISPATCHED:
                self._abandon(job, self.replica_of[j], now)
            self.apply(now, BY_ALL)  # as the gateway: each end, then what it lets go
            j += 1
        self.waiting = j

    def _abandon(self, job: Job, k: int, now: float) -> None:
        """Abort dispatched ``job`` at replica ``k``, its client gone at ``now``."""
        self.steps.settle(k, now, BY_ALL)
        snap = self.batchers[k].seq_state(job.id)
        self.batchers[k].abort(job.id)
        self.load[k] -= 1
        gen = snap.generated_tokens if snap is not None else 0
        self.machine.client_gone(job, Usage(job.prompt_tokens, gen))

    def deliver(self, k: int, events: list[EngineEvent], t: float) -> None:
        """Deliver the events of replica ``k``'s step ending at ``t`` to the machine, each
        end followed by what it lets go.  An event of a job no longer dispatched there (its
        client gave up during the step, or it was taken back and perhaps sent again: an
        attempt sent at ``t`` has no step ending at ``t``) is dropped."""
        machine = self.machine
        jobs = self.jobs
        may_have_left = self.timeout is not None or self.preempts
        for e in events:
            job = jobs[int(e.seq_id)]
            assert job is not None  # an engine runs only what was sent
            if may_have_left and (job.state is not _DISPATCHED or job.dispatched_at == t):
                continue
            if type(e) is FirstToken:
                machine.first_token(job)
            elif type(e) is Finished:
                machine.completed(job, new_tuple(Usage, (e.prompt_tokens, e.output_tokens, 0)))
                self.load[k] -= 1
                self.apply(t, k)  # as the gateway: each end, then what it lets go

    def dispatch(self, now: float, by: int) -> None:
        """Tick the machine at ``now`` and carry out what it dispatches."""
        self.machine.tick()
        self.apply(now, by)

    def apply(self, now: float, by: int, todo: list[Effect] | None = None) -> None:
        """Carry out ``todo`` (default: the machine's pending effects), in order, and those
        they lead to (a send that fails ends its job, which may dispatch more: after).
        ``by``: the replica whose step end is being handled (:data:`BY_ALL`: none)."""
        if todo is None:
            todo = self.machine.effects()
        while todo:
            for e in todo:
                t = type(e)
                if t is Send:
                    self.send(e.job, now, by)
                elif t is Settle:
                    j = e.job
                    self.store.finish(j.id, j.tenant, e.claims, e.lines, j.pool)  # type: ignore[union-attr]
                elif t is Cancel:
                    self.cancel(e.job, e.refusal is None, now, by)  # type: ignore[union-attr]
            todo = self.machine.effects()

    def send(self, job: Job, now: float, by: int) -> None:
        """Send a dispatched job to a replica; one too long, or with no engine to take it,
        fails at once.  An idle replica given work starts stepping at ``now``."""
        idx = int(job.id)
        pool = self.req_pool[idx]
        if self.prompts[idx] + self.outputs[idx] > self.inp.max_len or not self.members[pool]:
            self.machine.failed(job, Reason.UPSTREAM_ERROR)  # too long, or no engine to take it
            return
        k = self.scrapes.route(pool, now, self.inp.blocks[idx], self.inp.block_tokens[idx], job)
        if self.steps.runs[k] is not None:
            self.steps.settle(k, now, by)
        self._add(job, idx, k, now)
        self.scrapes.sent(job, k)
        self.machine.sent(job)
        self.fresh[k] += 1
        self.load[k] += 1
        self.replica_of[idx] = k
        if self.record:
            self.decisions.append((now, "dispatch", job.id, str(k)))
        if not self.active[k]:
            self.fleet.start_busy(k, now)
            self.steps.begin(k, now)

    def _add(self, job: Job, idx: int, k: int, now: float) -> None:
        """Add ``job`` (request ``idx``) to batcher ``k`` at ``now``."""
        inp = self.inp
        engine_prio = inp.engine_priority
        self.batchers[k].add(
            job.id,
            self.prompts[idx],
            self.outputs[idx],
            now,
            priority=engine_prio.get((job.pool, job.tier), 0) if engine_prio else 0,
            prefix_id=inp.templates[idx],
            prefix_tokens=inp.prefix_tokens[idx],
            block_ids=inp.blocks[idx],
            block_tokens=inp.block_tokens[idx],
        )

    def cancel(self, job: Job, requeued: bool, now: float, by: int) -> None:
        """Cancel at its replica a job the machine took back (preemption)."""
        k = self.replica_of[int(job.id)]
        self.steps.settle(k, now, by)
        if self.batchers[k].abort(job.id):
            self.load[k] -= 1
        if self.record:
            self.decisions.append((now, "preempt", job.id, "requeued" if requeued else "ended"))


def _detail(job: Job, state: JobState) -> str:
    """What the arrival's decision was, from the job's ``state`` just after it."""
    if state is _QUEUED:
        return "queued"
    if state is JobState.REJECTED:
        assert job.reason is not None
        return f"rejected:{job.reason.code}"
    return "admitted"
