"""The sans-IO admission core: every admission decision, no I/O, time passed in.

Dependencies: this package imports nothing of velvetrope but :mod:`velvetrope.clock` and
:mod:`velvetrope.errors`.  See :class:`~velvetrope.core.controller.AdmissionController`.
"""

from velvetrope.core.bucket import (
    BucketSnapshot,
    Claim,
    Denial,
    Grant,
    MemoryBuckets,
    TokenBucket,
)
from velvetrope.core.bucket_limits import BucketLimits
from velvetrope.core.controller import (
    AdmissionController,
    Decision,
    Dispatched,
    Preempted,
    Queued,
    Rejected,
)
from velvetrope.core.estimate import OutputEstimator, P2Quantile, QuantileEstimator
from velvetrope.core.job import Job, Outcome
from velvetrope.core.lifecycle import JobState, Reason, Settlement, Usage
from velvetrope.core.policy import (
    DegradePolicy,
    EstimatorPolicy,
    PolicyConfig,
    QueuePolicy,
    RouteRule,
    SaturationPolicy,
    TenantPolicy,
    TierPolicy,
)
from velvetrope.core.pool_policy import PoolPolicy
from velvetrope.core.presets import PRESETS, apply_preset, preset_names
from velvetrope.core.routing import DEFAULT_ROUTE, Routed, Router, least_loaded
from velvetrope.core.saturation import EngineReading, EngineSaturation

__all__ = [
    "DEFAULT_ROUTE",
    "PRESETS",
    "AdmissionController",
    "BucketLimits",
    "BucketSnapshot",
    "Claim",
    "Decision",
    "DegradePolicy",
    "Denial",
    "Dispatched",
    "EngineReading",
    "EngineSaturation",
    "EstimatorPolicy",
    "Grant",
    "Job",
    "JobState",
    "MemoryBuckets",
    "Outcome",
    "OutputEstimator",
    "P2Quantile",
    "PolicyConfig",
    "PoolPolicy",
    "Preempted",
    "QuantileEstimator",
    "QueuePolicy",
    "Queued",
    "Reason",
    "Rejected",
    "RouteRule",
    "Routed",
    "Router",
    "SaturationPolicy",
    "Settlement",
    "TenantPolicy",
    "TierPolicy",
    "TokenBucket",
    "Usage",
    "apply_preset",
    "least_loaded",
    "preset_names",
]
