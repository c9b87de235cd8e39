"""Capacity planning: closed-form queueing answers to "how many servers, what wait".

:mod:`velvetrope.planner.queueing` holds the pure formulas (Little, Erlang B/C, M/M/1,
M/M/c, Pollaczek–Khinchine, Cobham priority, Phipps SJF, Kingman, Allen–Cunneen) that the
sizing tools build on and that the simulator cross-checks.
"""

from velvetrope.planner import queueing

__all__ = ["queueing"]
