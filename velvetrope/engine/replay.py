"""Replay a published benchmark run on the engine model, in virtual time, with linear forms.

:func:`replay` drives a :class:`~velvetrope.engine.batcher.Batcher` through one
:class:`~velvetrope.engine.published.Scenario` — its requests, arrivals and the engine
configuration the source ran (``max_num_batched_tokens``, and ``max_num_seqs`` when the
source published it; the profile's own otherwise) — and
returns, for each published row of the run, the model's value of that metric computed
exactly as ``benchmark_serving`` computes it:

* **TTFT** of a request: first-token time minus send time;
* **TPOT** of a request: ``(last token - first token) / (output - 1)``, over requests with
  more than one output token;
* **E2E** latency of a request: last-token time minus send time;
* **throughput**: requests (or output tokens, or all tokens) over the time from the first
  send to the last completion;

then the row's statistic over requests (mean, median as numpy's, max).

**Scheduling is the profile's.**  The batcher runs the profile's scheduler
(``profile.scheduler``, the mode every other user of the profile runs); a row names the
scheduler its source ran, and a row whose scheduler is not the profile's raises
:class:`~velvetrope.errors.PolicyError` (it belongs to another profile).  What the row
changes is the engine's configuration, as a user sets it in the profile: the seat count
(``max_num_seqs``, when the source published it), the token budget and multi-step
scheduling's ``num_scheduler_steps``.

**Linear forms.**  For a fixed schedule (which sequences each step holds) every step lasts
``theta . f + c`` where ``theta = (step_base_s, per_prefill_token_s, per_decode_seq_s,
per_context_token_s)``, ``f = (1, prefill tokens, decoding sequences, context tokens)`` and
``c`` the profile's fixed tensor-parallel terms.  Each step ends at its busy period's start
plus the sum of the period's steps so far, so every time above is ``const + grad . theta``
(a latency as the sum of the steps between its two events, the step in progress at a
request's arrival counted for the fraction that was left): :class:`Prediction` carries that
:class:`LinearForm`, which lets a fit
(:mod:`velvetrope.engine.fit_published`) re-evaluate the metric for other coefficients
without re-simulating, exactly while the schedule stays the same.

Speculative decoding and prefix caching are switched off (the published runs used
neither).  Deterministic; cost O(steps x running sequences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from velvetrope.engine.batcher import Batcher, Finished, FirstToken
from velvetrope.engine.profile import COEFFICIENTS, EngineProfile
from velvetrope.engine.published import PublishedPoint, Scenario
from velvetrope.errors import PolicyError

__all__ = [
    "LinearForm",
    "Prediction",
    "engine_for",
    "replay",
    "replay_all",
    "theta_of",
]

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class LinearForm:
    """A duration ``const + grad . theta`` (seconds) for coefficients ``theta`` (in the order
    of :data:`~velvetrope.engine.profile.COEFFICIENTS`)."""

    const: float
    grad: FloatArray

    def at(self, theta: FloatArray) -> float:
        """The duration for coefficients ``theta`` (same order as :data:`COEFFICIENTS`)."""
        return float(self.const + self.grad @ theta)


@dataclass(frozen=True)
class Prediction:
    """The model's value of one published row, and how it depends on the coefficients.

    For latencies ``value = 1000 * form.at(theta)`` (ms); for throughput
    ``value = work / form.at(theta)`` (``work``: requests or tokens, ``form``: the
    benchmark's duration).
    """

    point: PublishedPoint
    value: float
    form: LinearForm
    work: float | None

    def at(self, theta: FloatArray) -> float:
        """The row's value for other coefficients, assuming the same schedule."""
        t = self.form.at(theta)
        if self.work is None:
            return 1000.0 * t
        return self.work / t if t > 0 else float("inf")

    @property
    def rel_error(self) -> float:
        """``(model - published) / published``."""
        return (self.value - self.point.value) / self.point.value


def theta_of(profile: EngineProfile) -> FloatArray:
    """The coefficient vector of ``profile`` (order of :data:`COEFFICIENTS`)."""
    return np.array([getattr(profile, n) for n in COEFFICIENTS], dtype=np.float64)


def engine_for(profile: EngineProfile, p: PublishedPoint) -> EngineProfile:
    """``profile`` configured as the row's source ran it: its budget, its multi-step
    setting and its ``max_num_seqs`` when published (else the profile's); no prefix caching
    or speculation.  The scheduler stays the profile's: a row of another scheduler raises
    :class:`~velvetrope.errors.PolicyError`."""
    if p.scheduler != profile.scheduler:
        raise PolicyError(
            f"row {p.id!r} ran the {p.scheduler} scheduler; profile {profile.name!r} models "
            f"{profile.scheduler}"
        )
    return profile.with_overrides(
        max_num_seqs=p.max_num_seqs if p.max_num_seqs is not None else profile.max_num_seqs,
        max_num_batched_tokens=p.max_num_batched_tokens,
        num_scheduler_steps=p.scheduler_steps,
        enable_prefix_caching=False,
        spec_tokens=0,
    )


@dataclass
class _Trace:
    """Per-step features of one simulated run (``theta``: the coefficients it ran with)."""

    f: FloatArray  # (steps, 4): (1, prefill, decode, context) of each step
    fixed: FloatArray  # (steps,): each step's fixed (tensor-parallel) seconds
    cum: FloatArray  # (steps, 4): cumulative f over the whole run
    cfix: FloatArray  # (steps,): cumulative fixed seconds
    pcum: FloatArray  # (steps, 4): cumulative f within the step's busy period
    pfix: FloatArray  # (steps,): cumulative fixed seconds within the busy period
    anchor: FloatArray  # (steps,): start time of the step's busy period
    ends: FloatArray  # (steps,): end time of each step
    dur: FloatArray  # (steps,): duration of each step
    first: NDArray[np.int64]  # step index of each request's first token
    finish: NDArray[np.int64]  # step index of each request's last token

    def end(self, step: int) -> LinearForm:
        """The end time of ``step``: its period's start plus the period's steps so far."""
        return LinearForm(float(self.anchor[step] + self.pfix[step]), self.pcum[step])

    def span(self, after: int, upto: int) -> LinearForm:
        """The summed duration of steps ``after + 1 .. upto`` (one busy period)."""
        if after < 0:
            return LinearForm(float(self.cfix[upto]), self.cum[upto].copy())
        return LinearForm(
            float(self.cfix[upto] - self.cfix[after]), self.cum[upto] - self.cum[after]
        )

    def wait(self, arrival: float, upto: int) -> LinearForm:
        """From ``arrival`` to the end of step ``upto``, as a sum of local step durations.

        The step in progress at ``arrival`` counts for the fraction of it that was left, so
        the form stays a short sum (a long busy period's absolute times would make it the
        small difference of large numbers).
        """
        sp = int(np.searchsorted(self.ends - self.dur, arrival, side="right")) - 1
        if sp < 0:
            return self.span(-1, upto)
        left = self.ends[sp] - arrival
        phi = min(max(left / self.dur[sp], 0.0), 1.0) if self.dur[sp] > 0 else 0.0
        rest = self.span(sp, upto)
        return LinearForm(rest.const + phi * float(self.fixed[sp]), rest.grad + phi * self.f[sp])


def _simulate(s: Scenario, prof: EngineProfile, theta: FloatArray) -> _Trace:
    b = Batcher(prof, token_events=False)
    prompts, outputs, arrivals = s.prompts, s.outputs, s.arrivals
    n = len(prompts)
    rows: list[tuple[int, int, int]] = []
    period: list[int] = []
    anchors: list[float] = []
    ends: list[float] = []
    first = np.full(n, -1, dtype=np.int64)
    finish = np.full(n, -1, dtype=np.int64)
    nxt, now = 0, float(arrivals[0])
    tp_fixed = prof.tp_allreduce_s
    tp_tok = prof.tp_per_token_s
    fixed: list[float] = []
    while nxt < n or b.has_work:
        if not b.has_work:
            now = max(now, float(arrivals[nxt]))
            anchors.append(now)
        while nxt < n and arrivals[nxt] <= now:
            b.add(str(nxt), int(prompts[nxt]), int(outputs[nxt]), float(arrivals[nxt]))
            nxt += 1
        r = b.step(now)
        idx = len(rows)
        rows.append((r.prefill_tokens, r.decode_seqs, r.context_tokens))
        fixed.append(tp_fixed + tp_tok * (r.prefill_tokens + r.decode_seqs))
        period.append(len(anchors) - 1)
        for e in r.events:
            if isinstance(e, FirstToken):
                first[int(e.seq_id)] = idx
            elif isinstance(e, Finished):
                finish[int(e.seq_id)] = idx
        now = r.end
        ends.append(now)
    f = np.empty((len(rows), 4))
    f[:, 0] = 1.0
    f[:, 1:] = np.asarray(rows, dtype=np.float64)
    fx = np.asarray(fixed)
    per = np.asarray(period)
    starts = np.flatnonzero(np.r_[True, per[1:] != per[:-1]])
    cum = np.cumsum(f, axis=0)
    cfix = np.cumsum(fx)
    before = np.repeat(starts, np.diff(np.r_[starts, len(per)])) - 1
    pcum = cum - np.where(before[:, None] >= 0, cum[np.maximum(before, 0)], 0.0)
    pfix = cfix - np.where(before >= 0, cfix[np.maximum(before, 0)], 0.0)
    return _Trace(
        f=f,
        fixed=fx,
        cum=cum,
        cfix=cfix,
        pcum=pcum,
        pfix=pfix,
        anchor=np.asarray(anchors)[per],
        ends=np.asarray(ends),
        dur=f @ theta + fx,
        first=first,
        finish=finish,
    )


def _pick(forms: list[LinearForm], stat: str, theta: FloatArray) -> LinearForm:
    if stat == "mean":
        return LinearForm(
            float(np.mean([f.const for f in forms])), np.mean([f.grad for f in forms], axis=0)
        )
    values = np.array([f.at(theta) for f in forms])
    order = np.argsort(values, kind="stable")
    if stat == "max":
        return forms[int(order[-1])]
    m = len(order)
    if m % 2:
        return forms[int(order[m // 2])]
    a, b = forms[int(order[m // 2 - 1])], forms[int(order[m // 2])]
    return LinearForm((a.const + b.const) / 2.0, (a.grad + b.grad) / 2.0)


def replay(scenario: Scenario, profile: EngineProfile) -> list[Prediction]:
    """The model's value of every row of ``scenario`` for ``profile`` (see module docstring)."""
    p0 = scenario.first
    prof = engine_for(profile, p0)
    theta = theta_of(prof)
    tr = _simulate(scenario, prof, theta)
    arrivals, outputs, prompts = scenario.arrivals, scenario.outputs, scenario.prompts
    out: list[Prediction] = []
    for p in scenario.points:
        if p.metric == "throughput":
            last = int(tr.finish.max())
            end = tr.end(last)
            form = LinearForm(end.const - float(arrivals[0]), end.grad)
            work = {
                "req_s": float(len(prompts)),
                "out_tok_s": float(outputs.sum()),
                "total_tok_s": float(outputs.sum() + prompts.sum()),
            }[p.unit]
            pred = Prediction(p, work / form.at(theta), form, work)
        else:
            forms: list[LinearForm] = []
            for i in range(len(prompts)):
                fi = int(tr.first[i])
                if p.metric == "ttft":
                    forms.append(tr.wait(float(arrivals[i]), fi))
                elif p.metric == "e2e":
                    forms.append(tr.wait(float(arrivals[i]), int(tr.finish[i])))
                elif outputs[i] > 1:
                    sp = tr.span(fi, int(tr.finish[i]))
                    n = float(outputs[i] - 1)
                    forms.append(LinearForm(sp.const / n, sp.grad / n))
            form = _pick(forms, p.stat, theta)
            pred = Prediction(p, 1000.0 * form.at(theta), form, None)
        out.append(pred)
    return out


def replay_all(
    scenarios: Sequence[Scenario], profiles: dict[str, EngineProfile]
) -> list[Prediction]:
    """:func:`replay` every scenario with the profile its rows name, scenario by scenario."""
    preds: list[Prediction] = []
    for s in scenarios:
        preds.extend(replay(s, profiles[s.first.profile]))
    return preds
