"""Capacity planning: queueing answers to "how many servers, what wait".

:mod:`velvetrope.planner.queueing` holds the pure formulas (Little, Erlang B/C, M/M/1,
M/M/c, Pollaczek–Khinchine, Cobham priority, Phipps SJF, Kingman, Allen–Cunneen, the G/D/c
recursion); :mod:`~velvetrope.planner.predict` is the fleet model the sizing
(:mod:`~velvetrope.planner.sizing`, :mod:`~velvetrope.planner.measured`) uses, and
:mod:`~velvetrope.planner.rules` the seeds' rules of thumb printed beside it.  Which formula
serves where is in ``docs/planner.md`` ("What the planner computes").
"""

from velvetrope.planner import queueing

__all__ = ["queueing"]
