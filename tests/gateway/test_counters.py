"""The loop counters expose exactly what prometheus_client's own metrics expose."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from velvetrope.gateway.ops.counters import LoopCounter, LoopHistogram

BUCKETS = (0.005, 0.1, 1.0, 10.0)
VALUES = (0.0, 0.005, 0.0051, 0.1, 0.7, 1.0, 9.99, 10.0, 10.01, 1e9)


def test_same_exposition_as_prometheus_client() -> None:
    ref = CollectorRegistry()
    c = Counter("vr_things", "Things.", ["tier", "reason"], registry=ref)
    h = Histogram("vr_wait_seconds", "Waits.", ["tier"], buckets=BUCKETS, registry=ref)
    ours = CollectorRegistry()
    c2 = LoopCounter("vr_things", "Things.", ["tier", "reason"])
    h2 = LoopHistogram("vr_wait_seconds", "Waits.", ["tier"], BUCKETS)
    ours.register(c2)
    ours.register(h2)
    for i, v in enumerate(VALUES):
        tier = "gold" if i % 3 else "silver"
        c.labels(tier, "ok").inc(i)
        c2.labels(tier, "ok").inc(i)
        h.labels(tier).observe(v)
        h2.labels(tier).observe(v)

    def lines(reg: CollectorRegistry) -> list[str]:
        text = generate_latest(reg).decode()
        return sorted(x for x in text.splitlines() if not x.startswith("vr_things_created"))

    ref_lines = [x for x in lines(ref) if "_created" not in x]
    assert [x for x in lines(ours) if "_created" not in x] == ref_lines
