"""The gateway's ``/metrics`` as numbers: Prometheus text in, samples by name and labels out.

Sans-IO: :func:`parse_metrics` takes the text a gateway served and returns
:class:`Metrics`, the ``velvetrope_*`` samples of it (the gateway's own; the process and
Python collectors' lines are skipped unread).  The lines are read by
``prometheus_client``'s parser, as the gateway's scraper reads the engines'
(:func:`velvetrope.gateway.upstream.scrape.parse_vllm_metrics`), so escaped label values, ``NaN``
and timestamps are read as Prometheus reads them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Labels", "Metrics", "parse_metrics"]

Labels = tuple[tuple[str, str], ...]
"""A sample's label pairs, sorted by label name."""

_PREFIX = "velvetrope_"


@dataclass(frozen=True, slots=True)
class Metrics:
    """Samples by their name as exposed (counters with ``_total``, histograms as ``_sum``,
    ``_count`` and ``_bucket``), then by their labels."""

    samples: Mapping[str, Mapping[Labels, float]] = field(default_factory=dict)

    def series(self, name: str, **match: str) -> Iterator[tuple[dict[str, str], float]]:
        """Every sample of ``name`` whose labels include ``match``: its labels and value."""
        for labels, value in self.samples.get(name, {}).items():
            d = dict(labels)
            if all(d.get(k) == v for k, v in match.items()):
                yield d, value

    def value(self, name: str, **match: str) -> float | None:
        """The sum of the samples of ``name`` whose labels include ``match``; ``None`` if
        there are none."""
        values = [v for _, v in self.series(name, **match)]
        return sum(values) if values else None


def parse_metrics(text: str) -> Metrics:
    """The ``velvetrope_*`` samples of the exposition ``text``.

    Raises :class:`ValueError` when one of those lines is not valid exposition format (the
    caller shows that the metrics could not be read).  Other lines are not read: a sample
    is one line (a newline in a label value is escaped), and a comment line (``# HELP``,
    ``# TYPE``) names a family the parser does not need to know to read the samples."""
    ours = "\n".join(line for line in text.splitlines() if line.startswith(_PREFIX))
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(ours):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return Metrics(samples)
