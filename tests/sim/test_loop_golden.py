"""The event loop decides exactly as the loop it replaced: digests of whole runs, pinned.

The values were printed by ``python -m tests.sim.golden`` on the hand-rolled loop (the next
event as a minimum over five sources, with the fleet's scrapes and fast-forward) just before
the event environment replaced it; see :mod:`tests.sim.golden` for what each scenario
exercises.
"""

from __future__ import annotations

import pytest

from tests.sim.golden import SCENARIOS, digest

GOLDEN = {
    "stress-least-loaded": "3f9ba03449b9d70e0e85cc980140a70e668ec7e2",
    "stress-round-robin": "66a4c11b417c89b85e9291cbed8b5dd646fae64d",
    "stress-same-instant": "487eb906d11e62740b8687a5e44c7449d73f4fe1",
    "conv-overload": "851bdc776e78390db8aa00fdbbce0fb161949b52",
    "code-prefix": "20efc884908c865fed6c0267d9f3c8a4712fd48a",
    "routes-degrade-engines": "28b26f06c84d042da5137c9e7bfe157ad9ba6d40",
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_run_is_byte_identical_to_the_pinned_digest(name: str) -> None:
    assert digest(SCENARIOS[name]()) == GOLDEN[name]
