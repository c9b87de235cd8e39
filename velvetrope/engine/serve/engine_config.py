"""What a ``velvetrope engine`` server is: :class:`EngineConfig`, the settings
:class:`~velvetrope.engine.serve.app.EngineApp` is built from (the engine profile, the
speed, the served model's name, the tokenizer, the output policy, scheduling, limits and
the optional routes), checked when it is made (:class:`~velvetrope.errors.ConfigError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from velvetrope.engine.outputs import OutputPolicy
from velvetrope.engine.profile import EngineProfile
from velvetrope.errors import ConfigError
from velvetrope.openai.tokenizer import Tokenizer, get_tokenizer

__all__ = ["DEFAULT_MAX_BODY_BYTES", "EngineConfig"]

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""Request bodies above this many bytes get 413 (an 8,192-token prompt is ~35 kB)."""


def _default_tokenizer() -> Tokenizer:
    return get_tokenizer("cl100k_base")


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine server needs.

    ``speed`` is K (model seconds per wall second); ``math.inf`` means instant mode.
    ``scheduling`` is vLLM's ``--scheduling-policy`` (``fcfs`` or ``priority``).
    """

    profile: EngineProfile
    speed: float = 1.0
    model_name: str = "velvetrope-sim"
    tokenizer: Tokenizer = field(default_factory=_default_tokenizer)
    outputs: OutputPolicy = field(default_factory=OutputPolicy)
    scheduling: Literal["fcfs", "priority"] = "fcfs"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    faults: bool = False
    """Answer a body's ``velvetrope_fault`` status (see
    :mod:`velvetrope.engine.serve.completions`)."""
    metrics_dialect: str = "vllm"
    """Whose metric names ``/metrics`` speaks (:data:`~velvetrope.engine.serve.metrics.
    DIALECTS`); ``none``: no ``/metrics`` route (404)."""
    journal: str | None = None
    """A file to append each request's start and end to
    (:mod:`velvetrope.engine.serve.journal`)."""
    api_key: str | None = None
    """Required as ``Authorization: Bearer KEY`` on ``/v1/`` routes (see
    :mod:`velvetrope.engine.serve.app`)."""
    health_route: bool = True
    """Serve ``GET /health`` (``False``: 404, an engine without one)."""

    def __post_init__(self) -> None:
        if not (self.speed > 0 and not math.isnan(self.speed)):
            raise ConfigError(f"engine speed must be positive (or inf), got {self.speed!r}")
        if self.scheduling not in ("fcfs", "priority"):
            raise ConfigError(
                f"engine scheduling must be 'fcfs' or 'priority', got {self.scheduling!r}"
            )
        if not self.model_name:
            raise ConfigError("engine model name must not be empty")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")

    @property
    def instant(self) -> bool:
        """Zero model time: every answer is written at once."""
        return self.speed == math.inf
