"""The event loop decides exactly as the loop it replaced: whole runs, pinned.

Each run is checked against its stored records first (``tests/sim/goldens/``: a run that
differs fails with its first differing record, index, expected and got), then against the
digest pinned below.  The digests were printed by ``python -m tests.sim.golden`` on the
hand-rolled loop (the next event as a minimum over five sources, with the fleet's scrapes
and fast-forward) just before the event environment replaced it, except those of the runs
with the saturation rule on (``conv-overload``, ``code-prefix``, ``routes-degrade-engines``),
pinned again when the rule held a cold start to a slow-start window and the replica choice
began to prefer engines with room (issue 33), and ``conv-overload`` and ``code-prefix``
(the default profile's, rescaled by ``load``) once more when ``llama3-8b-h100`` took vLLM
V1's default of 1024 seats on an H100 (issue 29), and the three ``stress-*`` runs once
the drain rate stopped refusing waits longer than it had measured before its first turnover
(issue 39); see
:mod:`tests.sim.golden` for what each scenario exercises and for how to regenerate both
after a change meant to change decisions (``python -m tests.sim.golden --write``).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.sim.golden import SCENARIOS, digest, first_difference, records, stored

GOLDEN = {
    "stress-least-loaded": "c54fc56e2f2f6f5c8ad62c104721720514735528",
    "stress-round-robin": "2f0bb556a7363cbaa23e9d58fdf8db2c4e90d5c9",
    "stress-same-instant": "85ce59934dd90e03832347bcc17fc1588336fe93",
    "conv-overload": "6ce75b79ec15de9044fa43bd29dbffa06440c6d1",
    "code-prefix": "282d8641a0523615e4e871a025acd5e71c24379b",
    "routes-degrade-engines": "98758e94fcf4205a3f0dbffd2ab980df753c3aa8",
}

REGENERATE = "python -m tests.sim.golden --write {name} (then paste its digest into GOLDEN)"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_run_is_byte_identical_to_the_pinned_one(name: str) -> None:
    res = SCENARIOS[name]()
    expected = stored(name)
    assert expected is not None, f"no records stored for {name}: " + REGENERATE.format(name=name)
    diff = first_difference(expected, records(res))
    assert diff is None, f"{name}: {diff}\nif the change is meant: " + REGENERATE.format(name=name)
    # the records hold every value the digest hashes; the digest also pins what they do not
    # spell out (the raw bytes of every array) and the run before the event environment
    assert digest(res) == GOLDEN[name], f"{name}: every record equal, yet the digest differs"


def test_a_difference_is_reported_by_its_first_record() -> None:
    a = ["x", "decision 1: (0.5, 'arrive', '1', 'admitted')", "request 0: end=1.0", "tail"]
    b = ["x", "decision 1: (0.5, 'arrive', '1', 'queued')", "request 0: end=1.5", "tail"]
    diff = first_difference(a, b)
    assert diff is not None
    assert diff.splitlines() == [
        "record 1 differs (the first of 2 of 4 that do; 4 expected, 4 got):",
        "  expected: decision 1: (0.5, 'arrive', '1', 'admitted')",
        "  got:      decision 1: (0.5, 'arrive', '1', 'queued')",
    ]
    assert first_difference(a, list(a)) is None
    shorter = first_difference(a, a[:2])
    assert shorter is not None and "record 2 differs" in shorter and "shorter" in shorter
    longer = first_difference(a, [*a, "more"])
    assert longer is not None and "record 4 differs" in longer and "longer" in longer


def test_a_differing_row_names_its_changed_fields() -> None:
    want = "request 3: end=1.0 degraded='pool=spare, model=small' running=[1, 2] n=4"
    got = "request 3: end=1.0 degraded='max_tokens=128' running=[1, 3] n=4"
    diff = first_difference([want], [got])
    assert diff is not None
    assert diff.splitlines()[-1] == (
        "  changed:  degraded: 'pool=spare, model=small' -> 'max_tokens=128', "
        "running: [1, 2] -> [1, 3]"
    )
    escaped = first_difference(["r 0: s='a\\' b' t=1"], ["r 0: s='a\\' b' t=2"])
    assert escaped is not None and escaped.endswith("changed:  t: 1 -> 2")


def test_a_changed_value_changes_a_record() -> None:
    """The records are exact: a float's last bit, the sign of a zero, an array's dtype."""
    res = SCENARIOS["stress-round-robin"]()
    base = records(res)
    end = res.records.end.copy()
    object.__setattr__(res.records, "end", end)
    i = int(np.flatnonzero(~np.isnan(end))[0])  # a request that ended
    was = end[i]
    end[i] = np.nextafter(end[i], np.inf)  # one ulp later
    nudged = first_difference(base, records(res))
    assert nudged is not None and f"request {i}: " in nudged
    end[i] = 0.0
    zero = records(res)
    end[i] = -0.0
    signed = first_difference(zero, records(res))
    assert signed is not None and "end=-0.0" in signed
    end[i] = was
    assert first_difference(base, records(res)) is None
    object.__setattr__(res.records, "prompt", res.records.prompt.astype(np.int32))
    retyped = first_difference(base, records(res))
    assert retyped is not None and "record 0 differs" in retyped and "prompt=<i4" in retyped
