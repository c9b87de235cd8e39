"""A seeded slice of ``make fuzz`` in the suite: the same generator (``harness.fuzz``) and
the same checks, 250 requests against a real engine and gateway of its own.  Seed 2's
slice holds every sort of probe: mutated bodies and bytes, odd headers and routes, clients
hanging up mid-stream, bytes that are not HTTP, chunked bodies and bodies that stall."""

from __future__ import annotations

import pytest

from harness.fuzz import run

pytestmark = pytest.mark.integration

REQUESTS = 250


def test_a_seeded_slice_of_the_fuzzer_finds_no_5xx_no_bad_shape_and_no_leak() -> None:
    report = run(requests=REQUESTS, seed=2, concurrency=8, time_limit_s=120.0)
    assert report.ok(REQUESTS), "\n".join([report.line, *report.samples, *report.notes])
    # the slice reached the engine, the validation, the body timeout and the HTTP parser
    assert {200, 400, 408} <= set(report.statuses), report.statuses
    assert report.served
