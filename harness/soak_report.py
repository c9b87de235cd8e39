"""The soak's outputs: ``soak.csv``, ``soak.png`` and the verdict line.

The CSV has one row per :class:`~harness.soak_probe.Sample`, columns
:data:`~harness.soak_probe.COLUMNS`, an unreadable value left empty.  The PNG has one panel
per sampled series (resources, then the load), each judged series with its fitted line over
the fitted span (after the warm-up, shaded) and its verdict in the title.

The verdict line, the soak's last output (:func:`verdict_line`)::

    soak: hours=H rss_slope_mb_per_h=X fds_slope=Y tasks_slope=Z redis_keys_slope=W
          errors=E verdict=flat|growing                                 (on one line)

with slopes per hour; :data:`VERDICT_RE` reads it back.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from harness.soak_probe import COLUMNS, Sample
from harness.soak_trend import Trend

__all__ = ["VERDICT_RE", "plot_samples", "verdict_line", "write_csv"]

VERDICT_RE: Final = re.compile(
    r"^soak: hours=(?P<hours>[0-9.]+) rss_slope_mb_per_h=(?P<rss>\S+) fds_slope=(?P<fds>\S+) "
    r"tasks_slope=(?P<tasks>\S+) redis_keys_slope=(?P<keys>\S+) errors=(?P<errors>\d+) "
    r"verdict=(?P<verdict>flat|growing)$"
)
"""The verdict line, its fields named."""

_LOAD: Final = ("in_flight", "queued", "sent", "finished", "hung_up", "client_errors")


def write_csv(samples: Sequence[Sample], path: Path) -> Path:
    """Write the samples to ``path`` (parents made); return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(s.row() for s in samples)
    return path


def _num(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.3g}"


def verdict_line(hours: float, trends: Mapping[str, Trend], errors: int, flat: bool) -> str:
    """The soak's last line (module docstring); ``trends`` by series name."""
    return (
        f"soak: hours={hours:.3g} rss_slope_mb_per_h={_num(trends['rss_mb'].slope)} "
        f"fds_slope={_num(trends['fds'].slope)} tasks_slope={_num(trends['tasks'].slope)} "
        f"redis_keys_slope={_num(trends['redis_keys'].slope)} errors={errors} "
        f"verdict={'flat' if flat else 'growing'}"
    )


def plot_samples(
    samples: Sequence[Sample], trends: Mapping[str, Trend], fit_from_s: float, path: Path
) -> Path:
    """Draw every series (module docstring) to ``path`` (parents made); return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*trends, *_LOAD]
    cols = 3
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    t_min = [s.t_s / 60 for s in samples]
    for ax, name in zip(axes.flat, names, strict=False):
        ys = [float(getattr(s, name)) for s in samples]
        ax.plot(t_min, ys, ".-", ms=3, lw=0.8)
        ax.set_xlabel("minutes")
        tr = trends.get(name)
        if tr is None:
            ax.set_title(name)
            continue
        ax.axvspan(0, fit_from_s / 60, color="0.9", label="warm-up")
        xs = [t for t in t_min if t * 60 >= fit_from_s]
        if xs and tr.n >= 3:
            line = [tr.at(t / 60) for t in xs]
            ax.plot(xs, line, "r-", lw=1.5, label=f"{tr.slope:+.3g}/h")
        ax.legend(loc="best", fontsize=8)
        ax.set_title(f"{name}: {'flat' if tr.flat else 'GROWING'}")
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
