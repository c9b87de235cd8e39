"""Capacity planning: queueing answers to "how many servers, what wait".

:mod:`velvetrope.planner.queueing` (Little, Erlang B/C, M/M/1, M/M/c) and
:mod:`~velvetrope.planner.queueing_general` (Pollaczek–Khinchine, Cobham priority, Phipps
SJF, Kingman, Allen–Cunneen, the G/D/c recursion) hold the pure formulas;
:mod:`~velvetrope.planner.predict` is the fleet model the sizing
(:mod:`~velvetrope.planner.sizing`, :mod:`~velvetrope.planner.measured`) uses, and
:mod:`~velvetrope.planner.rules` the seeds' rules of thumb printed beside it.  Which formula
serves where is in ``docs/planner.md`` ("What the planner computes").
"""

from velvetrope.planner import queueing, queueing_general

__all__ = ["queueing", "queueing_general"]
