"""``velvetrope top``: a live terminal view of a running gateway or its replicas.

It polls each gateway's ``/admin/status`` (with the admin token) and ``/metrics`` every
second and shows, in 80×24 or more: the queue by pool, band and tenant with its waits;
outcomes per second by reason (admitted, rejected); bucket levels; in flight against each
pool's limit; the engines' readings (running, waiting, KV usage, the reading's age, the
breaker); the shared state (Redis) and the replicas.  Keys sort and filter the rows.

Modules, from the figures to the screen:

* :mod:`.exposition` (sans-IO): the ``velvetrope_*`` samples of a ``/metrics`` text;
* :mod:`.rows` (sans-IO): a poll's :class:`~.rows.Sample` and the frame's rows;
* :mod:`.model` (sans-IO): :func:`~.model.build_view`, samples (and the previous ones) to
  a :class:`~.model.View`: merged over the replicas, rates from counter increases, sorted and
  filtered;
* :mod:`.controls` (sans-IO): what the keys change;
* :mod:`.render`: the view drawn with rich within a width and height;
* :mod:`.poll`: the HTTP side (httpx); a gateway that does not answer is a sample that
  says why;
* :mod:`.run`: the loop, the terminal (cbreak mode when standard input is a terminal);
* :mod:`.cli`: the command (``velvetrope top --url URL [--url URL ...]``), loaded lazily
  by :mod:`velvetrope.cli`.
"""

from velvetrope.top.controls import SORTS, Controls, press
from velvetrope.top.exposition import Metrics, parse_metrics
from velvetrope.top.model import View, build_view
from velvetrope.top.rows import Sample

__all__ = [
    "SORTS",
    "Controls",
    "Metrics",
    "Sample",
    "View",
    "build_view",
    "parse_metrics",
    "press",
]
