"""A multi-tenant, multi-template synthetic workload, built for study (j) (it is ours, not
a recorded trace).

Five tenants run applications ("templates") behind one fleet: a ticket classifier, a
field extractor, a summariser, a chat assistant, a coding assistant and a report writer.
Each template has its own system prompt (a shared prefix, so its requests share a prompt
template fingerprint), its own distribution of user-prompt lengths and its own relation
between prompt and output: a classifier answers in a few tokens whatever it is given, a
summariser's answer grows with the document, a chat answer is long-tailed and barely
depends on the question.  Every request declares ``max_tokens`` (the template's), and
the engine stops there.  This is what a gateway in front of several applications sees;
the recorded Azure traces have one tenant, no template and no ``max_tokens``, so a
predictor can use only prompt lengths on them.

Output length: ``(base + per_prompt × user_tokens) × LogNormal(0, sigma)``, rounded,
clipped to ``[1, max_tokens]``; user tokens: ``LogNormal(log median, spread)``, at least 1.
Prompt = system + user tokens, and prompt + output never exceeds the model's context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from velvetrope.sim.trace_request import TraceRequest

__all__ = ["TEMPLATES", "TENANTS", "Template", "multi_template_workload"]

MAX_LEN = 8192


@dataclass(frozen=True)
class Template:
    """One application's request shape (see the module docstring)."""

    name: str
    system_tokens: int
    user_median: float
    user_spread: float
    out_base: float
    out_per_prompt: float
    out_sigma: float
    max_tokens: int


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("classify", 400, 150, 0.6, 4, 0.0, 0.5, 16),
        Template("extract", 600, 800, 0.5, 30, 0.08, 0.3, 256),
        Template("summarise", 300, 2000, 0.5, 0, 0.12, 0.3, 512),
        Template("chat", 200, 300, 0.8, 180, 0.0, 0.9, 1024),
        Template("code", 800, 1500, 0.6, 120, 0.0, 1.0, 1024),
        Template("report", 300, 200, 0.5, 700, 0.0, 0.4, 2048),
    )
}

TENANTS: tuple[tuple[str, float, tuple[tuple[str, float], ...]], ...] = (
    ("acme", 1.0, (("classify", 0.6), ("extract", 0.4))),
    ("globex", 1.0, (("chat", 1.0),)),
    ("initech", 1.0, (("summarise", 0.5), ("code", 0.5))),
    ("umbrella", 1.0, (("report", 0.3), ("chat", 0.4), ("classify", 0.3))),
    ("hooli", 1.0, (("code", 0.7), ("extract", 0.3))),
)
"""``(tenant, weight, ((template, share), ...))``: who sends what."""


def multi_template_workload(times: Sequence[float], seed: int) -> list[TraceRequest]:
    """One request per arrival time (sorted): a tenant by weight, one of its templates by
    share, lengths from the template.  The same seed gives the same workload."""
    rng = np.random.default_rng(seed)
    weights = np.asarray([w for _, w, _ in TENANTS], dtype=np.float64)
    weights /= weights.sum()
    who = rng.choice(len(TENANTS), size=len(times), p=weights)
    out: list[TraceRequest] = []
    for t, k in zip(times, who.tolist(), strict=True):
        tenant, _, apps = TENANTS[k]
        shares = np.asarray([s for _, s in apps])
        name = apps[int(rng.choice(len(apps), p=shares / shares.sum()))][0]
        tpl = TEMPLATES[name]
        user = max(1, round(tpl.user_median * math.exp(tpl.user_spread * rng.standard_normal())))
        user = min(user, MAX_LEN - tpl.system_tokens - tpl.max_tokens)
        mean = tpl.out_base + tpl.out_per_prompt * user
        o = round(mean * math.exp(tpl.out_sigma * rng.standard_normal()))
        o = max(1, min(tpl.max_tokens, o))
        out.append(
            TraceRequest(
                t=float(t),
                prompt_tokens=tpl.system_tokens + user,
                output_tokens=o,
                tenant=tenant,
                max_tokens=tpl.max_tokens,
                prefix_id=f"{tenant}/{name}",
                prefix_tokens=tpl.system_tokens,
            )
        )
    return out
