"""Counters and histograms for one event loop: no locks, exposed by a registry collector.

``prometheus_client``'s metrics take a lock on every ``inc`` and ``observe`` (they may be
shared by threads); a request through the gateway updates about a dozen of them, which
was a tenth of the admission path's CPU.  The gateway updates its metrics from one thread
(the event loop, which also renders ``/metrics``), so plain numbers suffice
(:mod:`velvetrope.gateway.ops.series`, compiled).
:class:`LoopCounter` and :class:`LoopHistogram` keep them and turn them into the same
exposition as ``prometheus_client``'s ``Counter``/``Histogram`` (names, labels, ``_total``,
``_bucket``/``_sum``/``_count``) at scrape time.  Not for use from several threads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from velvetrope.gateway.ops.series import CounterChild, HistogramChild

__all__ = ["LoopCounter", "LoopHistogram"]


class LoopCounter(Collector):
    """A labelled counter; ``name`` without ``_total`` (added on exposition)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self._children: dict[tuple[str, ...], CounterChild] = {}

    def labels(self, *values: str) -> CounterChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._children[values] = CounterChild()
        return child

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            fam.add_metric(list(values), child.value)
        yield fam


class LoopHistogram(Collector):
    """A labelled histogram with fixed bucket upper bounds (``le``, inclusive)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.bounds = tuple(sorted(float(b) for b in buckets if b != float("inf")))
        self._children: dict[tuple[str, ...], HistogramChild] = {}

    def labels(self, *values: str) -> HistogramChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._children[values] = HistogramChild(self.bounds)
        return child

    def collect(self) -> Iterator[HistogramMetricFamily]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, n in zip((*self.bounds, float("inf")), child.counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            fam.add_metric(list(values), buckets, child.sum)
        yield fam
