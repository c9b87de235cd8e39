"""The event loop decides exactly as the loop it replaced: digests of whole runs, pinned.

The values were printed by ``python -m tests.sim.golden`` on the hand-rolled loop (the next
event as a minimum over four sources) just before the event environment replaced it; see
:mod:`tests.sim.golden` for what each scenario exercises.
"""

from __future__ import annotations

import pytest

from tests.sim.golden import SCENARIOS, digest

GOLDEN = {
    "stress-least-loaded": "416c80549d18ef3ba5e9c31a2d2df0a50bddb11d",
    "stress-round-robin": "ad28ddf16f077a65f88546746b2f47c767a328eb",
    "stress-same-instant": "e4b6d0ef8af4d1228a0cef3aa8deb5de4e03f128",
    "conv-overload": "8ce33ce5527e6fab33f7fe535a466cde6d2231e2",
    "code-prefix": "5733f1646abbea1b76112382df1be28b6ddb967b",
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_run_is_byte_identical_to_the_pinned_digest(name: str) -> None:
    assert digest(SCENARIOS[name]()) == GOLDEN[name]
