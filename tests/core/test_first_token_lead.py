"""A queued job is not dispatched when its tier's recent leads to the first token would bring
its first token past its objective (:mod:`velvetrope.core.first_token_lead`): the measure
alone, then through the controller on a ManualClock."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.core.helpers import controller, make_job
from velvetrope.core import Dispatched, PolicyConfig, Queued, Usage
from velvetrope.core.first_token_lead import FirstTokenLead
from velvetrope.core.job import Job
from velvetrope.core.lifecycle import JobState, Reason

TTFT = {"interactive": 1.0, "standard": 5.0, "batch": None}


def _leads(lead: FirstTokenLead, tier: str, values: list[float], at: float) -> None:
    """Jobs of ``tier`` whose first tokens all came at ``at``, ``values`` after dispatch."""
    for v in values:
        job = make_job(tier=tier)
        job.dispatched_at = at - v
        lead.first_token(job, at)


def _queued(tier: str, arrival: float, deadline: float | None = None) -> Job:
    job = make_job(tier=tier, deadline=deadline)
    job.arrival = arrival
    return job


def test_the_lead_is_the_quantile_of_the_windows_leads_once_there_are_enough() -> None:
    lead = FirstTokenLead(TTFT, quantile=0.1, window_s=5.0, min_samples=8)
    _leads(lead, "standard", [0.5, 0.7, 0.9, 1.1, 1.3, 1.5, 1.7], at=10.0)
    assert lead.lead("standard", 10.0) is None  # 7 < 8 samples: no lead yet
    _leads(lead, "standard", [0.3, 2.0, 2.2, 2.4], at=10.0)
    # 11 leads sorted: 0.3, 0.5, ...; the ⌊0.1 × 11⌋ = 1st (from 0) is 0.5
    assert lead.lead("standard", 10.0) == pytest.approx(0.5)
    assert lead.lead("interactive", 10.0) is None  # its own tier's leads only
    assert lead.lead("batch", 10.0) is None  # no TTFT objective: not measured
    assert lead.lead("standard", 15.5) is None  # the window passed them by
    # a window of the jobs dispatched in it: a lead that began before it does not count
    slow = FirstTokenLead(TTFT, quantile=0.0, window_s=5.0, min_samples=8)
    _leads(slow, "standard", [6.0] * 8, at=10.0)  # dispatched at 4.0
    assert slow.lead("standard", 10.0) is None  # dispatched before 5.0: out of the window
    _leads(slow, "standard", [1.0] * 8, at=10.5)
    assert slow.lead("standard", 10.5) == pytest.approx(1.0)
    assert slow.lead("standard", 14.6) is None  # their dispatches at 9.5 left it too
    fastest = FirstTokenLead(TTFT, quantile=0.0, window_s=5.0, min_samples=8)
    _leads(fastest, "standard", [0.5, 0.7, 0.9, 1.1, 1.3, 1.5, 1.7, 0.3], at=10.0)
    assert fastest.lead("standard", 10.0) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="quantile"):
        FirstTokenLead(TTFT, quantile=1.0, window_s=5.0)


def test_a_reading_follows_a_window_that_lost_one_lead_and_gained_one() -> None:
    """The same number of leads, the last dispatched at the same instant (a burst): the
    window changed all the same, and the reading with it."""
    lead = FirstTokenLead(TTFT, quantile=0.9, window_s=5.0, min_samples=1)
    _leads(lead, "standard", [1.0], at=1.0)  # dispatched at 0
    _leads(lead, "standard", [2.0], at=6.0)  # dispatched at 4
    assert lead.lead("standard", 6.0) == pytest.approx(2.0)  # the window from 1.0: one lead
    _leads(lead, "standard", [2.5], at=6.5)  # dispatched at 4 too; the first one leaves
    assert lead.lead("standard", 6.5) == pytest.approx(2.5)


def test_a_job_is_too_late_when_the_lead_outlasts_what_its_objective_has_left() -> None:
    lead = FirstTokenLead(TTFT, quantile=0.0, window_s=5.0, min_samples=8)
    _leads(lead, "standard", [1.0] * 8, at=10.0)
    assert not lead.too_late(_queued("standard", arrival=6.0), 10.0)  # 11.0 == 11.0: in time
    assert lead.too_late(_queued("standard", arrival=5.9), 10.0)  # 11.0 > 10.9
    # its own deadline (x-slo-ttft-ms) is earlier than the tier's: that one counts
    assert lead.too_late(_queued("standard", arrival=9.0, deadline=10.5), 10.0)
    assert not lead.too_late(_queued("batch", arrival=-100.0), 10.0)  # no TTFT objective
    assert not lead.too_late(_queued("interactive", arrival=0.0), 10.0)  # no lead measured
    assert lead.expired == 2
    lead.retarget({"standard": 12.0})
    assert not lead.too_late(_queued("standard", arrival=5.9), 10.0)  # the reload's objective
    assert lead.status(10.0) == {"leads_s": {"standard": 1.0}, "expired": 2}


def _policy(**slo_limit: Any) -> dict[str, Any]:
    return {
        "tiers": [
            {"name": "interactive", "slo": {"ttft_s": 1.0}},
            {"name": "standard", "slo": {"ttft_s": 5.0}},
            {"name": "batch", "slo": {"e2e_s": 120}},
        ],
        "tenants": [
            {"name": "globex", "tier": "standard"},
            {"name": "initech", "tier": "batch"},
        ],
        "queue": {"bands": "strict"},
        "saturation": {"enabled": False},
        "pools": [
            {
                "name": "default",
                "max_in_flight": 10,
                "limit": "slo",
                "slo_limit": {"preempt": False, "start_window_s": 10, **slo_limit},
            }
        ],
    }


def test_the_controller_expires_a_queued_job_the_lead_makes_late_and_dispatches_the_next() -> None:
    ctl, clock = controller(_policy())
    measured = [make_job(tenant="globex", tier="standard") for _ in range(8)]
    for j in measured:
        assert isinstance(ctl.arrive(j), Dispatched)
    clock.set(2.0)  # eight first tokens 2 s after their dispatch: the standard tier's lead
    for j in measured:
        ctl.first_token(j.id)
        ctl.complete(j.id, Usage(100, 10))
    batch = [make_job(tenant="initech", tier="batch") for _ in range(10)]
    for j in batch:
        assert isinstance(ctl.arrive(j), Dispatched)  # the pool's 10 slots are taken
    late = make_job(tenant="globex", tier="standard")
    assert isinstance(ctl.arrive(late), Queued)  # at 2.0: due at 7.0
    clock.set(5.0)
    timely = make_job(tenant="globex", tier="standard")
    assert isinstance(ctl.arrive(timely), Queued)  # due at 10.0
    waiting = make_job(tenant="initech", tier="batch")
    assert isinstance(ctl.arrive(waiting), Queued)  # no TTFT objective: never too late
    clock.set(5.5)
    ctl.complete(batch[0].id, Usage(100, 10))
    # `late` would see its first token at 7.5, past 7.0: expired; `timely` takes the slot
    assert ctl.dispatchable() == [timely]
    assert late.state is JobState.EXPIRED and late.reason is Reason.EXPIRED
    assert [o.job for o in ctl.tick()] == [late]
    status = ctl.status()["pools"]["default"]["first_token_leads"]
    assert status["expired"] == 1 and status["leads_s"]["standard"] == pytest.approx(2.0)
    clock.set(10.5)  # the window has passed their dispatches by: no lead, only deadlines
    ctl.complete(batch[1].id, Usage(100, 10))
    assert ctl.dispatchable() == [waiting]


def test_without_a_quantile_a_job_is_dispatched_until_its_deadline() -> None:
    ctl, clock = controller(_policy(first_token_quantile=None))
    measured = [make_job(tenant="globex", tier="standard") for _ in range(8)]
    for j in measured:
        ctl.arrive(j)
    clock.set(2.0)
    for j in measured:
        ctl.first_token(j.id)
        ctl.complete(j.id, Usage(100, 10))
    batch = [make_job(tenant="initech", tier="batch") for _ in range(10)]
    for j in batch:
        ctl.arrive(j)
    late = make_job(tenant="globex", tier="standard")
    ctl.arrive(late)
    clock.set(5.5)
    ctl.complete(batch[0].id, Usage(100, 10))
    assert ctl.dispatchable() == [late]
    assert ctl.status()["pools"]["default"]["first_token_leads"] is None
    with pytest.raises(ValidationError, match="first_token_quantile"):
        PolicyConfig.model_validate(_policy(first_token_quantile=1.0))
