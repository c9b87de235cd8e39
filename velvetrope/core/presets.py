"""Named queue presets.  A preset fills ``PolicyConfig.queue``; fields the user set win.

``fifo``
    One FIFO for everyone: the baseline every other policy is measured against.
``sjf``
    Shortest predicted job first, one queue.  Lowest mean latency; long jobs can starve.
``sjf_aging``
    SJF whose size penalty is capped at ``aging_s`` of waiting: most of SJF's gain, with
    bounded starvation for long jobs.
``priority``
    Strict priority by tier, FIFO inside: the top tier never waits behind a lower one.
``fair``
    One band, VTC fairness between tenants: a heavy tenant cannot crowd out light ones.
``hybrid``
    The combination we ship: tier bands sharing dispatched tokens by weight (top tier
    10×), VTC between the tenants of a band, SJF with aging inside a tenant, short
    completions (< 200 predicted output tokens) weighted 3×, aging from 15 s.  Pair it with
    per-tenant token buckets in the tenants' ``limits``.
"""

from __future__ import annotations

from typing import Any

from velvetrope.core.policy import PolicyConfig, QueuePolicy
from velvetrope.errors import PolicyError

__all__ = ["PRESETS", "apply_preset", "preset_names"]

PRESETS: dict[str, dict[str, Any]] = {
    "fifo": {"bands": "single", "fairness": "none", "ordering": "fcfs"},
    "sjf": {"bands": "single", "fairness": "none", "ordering": "sjf"},
    "sjf_aging": {"bands": "single", "fairness": "none", "ordering": "sjf_aging", "aging_s": 15.0},
    "priority": {"bands": "strict", "fairness": "none", "ordering": "fcfs"},
    "fair": {"bands": "single", "fairness": "vtc", "ordering": "fcfs"},
    "hybrid": {
        "bands": "weighted",
        "fairness": "vtc",
        "ordering": "sjf_aging",
        "aging_s": 15.0,
        "short_output_tokens": 200,
        "short_boost": 3.0,
    },
}

_HYBRID_TOP_WEIGHT = 10.0


def preset_names() -> list[str]:
    return sorted(PRESETS)


def apply_preset(config: PolicyConfig, name: str | None = None) -> PolicyConfig:
    """Return ``config`` with preset ``name`` (default: ``config.preset``) applied.

    Queue fields the user set explicitly are kept.  ``hybrid`` also gives the top tier
    weight 10 unless some tier's weight was set explicitly.
    """
    name = name if name is not None else config.preset
    if name is None:
        return config
    try:
        preset = PRESETS[name]
    except KeyError:
        raise PolicyError(f"unknown preset {name!r}; known: {', '.join(preset_names())}") from None
    explicit = config.queue.model_dump(include=config.queue.model_fields_set)
    queue = QueuePolicy.model_validate({**preset, **explicit})
    update: dict[str, Any] = {"queue": queue, "preset": name}
    if name == "hybrid" and not any("weight" in t.model_fields_set for t in config.tiers):
        tiers = list(config.tiers)
        tiers[0] = tiers[0].model_copy(update={"weight": _HYBRID_TOP_WEIGHT})
        update["tiers"] = tuple(tiers)
    return config.model_copy(update=update)
