"""The gateway's own process on ``/metrics``: asyncio tasks, resident memory, open files.

In process, no server: the registry is read inside a running event loop (as the ASGI app
reads it) and outside one (the tasks gauge is then absent, not wrong).
"""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from velvetrope.config import parse_config
from velvetrope.gateway.api.app import Gateway

from .conftest import gateway_config


def _values(text: bytes) -> dict[str, float]:
    """Unlabelled samples by name."""
    return {
        s.name: s.value
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
        if not s.labels
    }


def test_tasks_gauge_counts_the_loops_tasks_at_scrape_time() -> None:
    gw = Gateway(parse_config(gateway_config(["http://127.0.0.1:9"])))

    async def scrape_around_tasks() -> tuple[float, float, float, int]:
        before = _values(gw.metrics.render())["velvetrope_asyncio_tasks"]
        alive = len(asyncio.all_tasks())
        gate = asyncio.Event()
        waiters = [asyncio.create_task(gate.wait()) for _ in range(7)]
        during = _values(gw.metrics.render())["velvetrope_asyncio_tasks"]
        gate.set()
        await asyncio.gather(*waiters)
        after = _values(gw.metrics.render())["velvetrope_asyncio_tasks"]
        return before, during, after, alive

    before, during, after, alive = asyncio.run(scrape_around_tasks())
    assert before == alive >= 1  # this coroutine's own task at least
    assert during == before + 7
    assert after == before
    assert "velvetrope_asyncio_tasks" not in _values(gw.metrics.render())  # no loop here


def test_process_collector_reports_memory_and_open_files() -> None:
    gw = Gateway(parse_config(gateway_config(["http://127.0.0.1:9"])))
    values = _values(gw.metrics.render())
    assert values["process_resident_memory_bytes"] > 0
    assert values["process_open_fds"] >= 3  # stdin, stdout, stderr at least
