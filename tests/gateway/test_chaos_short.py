"""A short ``make chaos``, end to end: real Redis, engines and gateways, one Redis restart
under load, every invariant counted (:mod:`harness.chaos`)."""

from __future__ import annotations

import pytest

from harness.chaos import run_policy

pytestmark = pytest.mark.integration


def test_a_redis_restart_under_load_breaks_no_invariant() -> None:
    """``fail_open``, 15 s at 30 requests/s, Redis SIGKILLed and restarted empty after
    5 s: no 500, every request ended once, nothing leaked, settlements add up, the deployment's
    ``max_in_flight`` held at the engines through the fallback and the leases re-asserted
    after it, the priority order held."""
    v = run_policy("fail_open", seconds=15.0, rate=30.0, seed=7, full=False, redis_empty=True)
    report = "\n".join([*v.details, *v.problems, v.line()])
    assert v.requests > 300, report
    assert not v.problems, report
    assert v.counts == dict.fromkeys(v.counts, 0), report
