"""velvetrope: admission control for LLM inference.

The admission policy lives in :mod:`velvetrope.core` (sans-IO, time passed in through a
:class:`~velvetrope.clock.Clock`); the gateway, the simulator and the planner are built on it.
"""

import velvetrope.fresh  # noqa: F401 (first: refuses stale compiled modules)
from velvetrope.clock import Clock, ManualClock, SystemClock

__all__ = ["Clock", "ManualClock", "SystemClock", "__version__"]

__version__ = "0.1.0"
