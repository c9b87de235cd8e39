"""Suite-wide rule: a test that starts a real server is marked ``integration``.

Every server the tests start as a subprocess goes through
:func:`velvetrope.serving.launch.start` (``velvetrope engine``, ``velvetrope serve``, the
demo's processes); it is wrapped here so that starting one from a test without the marker
fails that test with a message saying so (also when a module- or session-scoped fixture
starts it on the test's behalf).  ``pytest -m "not integration"`` then runs no server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from velvetrope.serving import launch

_current: list[pytest.Item] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[:] = [item]


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _current.clear()


def _only_in_integration_tests(start: Callable[..., Any]) -> Callable[..., Any]:
    def checked(*args: Any, **kwargs: Any) -> Any:
        for item in _current:
            if item.get_closest_marker("integration") is None:
                pytest.fail(
                    f"{item.nodeid} starts a server (velvetrope {' '.join(args[0])}): "
                    "mark it @pytest.mark.integration",
                    pytrace=False,
                )
        return start(*args, **kwargs)

    return checked


launch.start = _only_in_integration_tests(launch.start)
