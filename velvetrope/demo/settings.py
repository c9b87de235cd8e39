"""What the demo can vary (:class:`DemoSettings`), its three runs, and the example config.

Bad settings raise :class:`~velvetrope.errors.PolicyError`; a missing or unusable config
raises :class:`~velvetrope.errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from velvetrope import checks
from velvetrope.core.policy import SloPolicy
from velvetrope.errors import ConfigError, PolicyError
from velvetrope.yaml_config import parse_yaml, read_text

__all__ = [
    "DEFAULT_CONFIG",
    "DIRECT",
    "DIRECT_PRIORITY",
    "GATEWAY",
    "RUNS",
    "RUN_LABEL",
    "DemoSettings",
    "read_config",
    "tenant_keys",
]

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "data" / "examples" / "gateway.yaml"
"""The example config, shipped in the package (``examples/gateway.yaml`` of a checkout links
to it; ``velvetrope init`` writes a copy to edit)."""

GATEWAY = "gateway"
"""The run through the gateway."""
DIRECT = "direct"
"""The run straight to the engines, round-robin, with no admission and no ``priority``
field: first come, first served (also when the engines run in priority mode)."""
DIRECT_PRIORITY = "direct_priority"
"""The run straight to the engines, round-robin, with no admission, each request carrying
its tier's index in ``policy.tiers`` as vLLM's ``priority`` (0 = the top tier): what a user
gets from vLLM's ``--scheduling-policy priority`` alone.  Only when the engines run in
priority mode (a pool of the config sets ``engine_priority: true``)."""
RUNS = (GATEWAY, DIRECT, DIRECT_PRIORITY)
"""Every run, in the order the demo runs them."""
RUN_LABEL = {
    GATEWAY: "gateway",
    DIRECT: "direct (no admission)",
    DIRECT_PRIORITY: "direct, engine priority = tier",
}
"""How each run is named in the report."""


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """Everything the demo can vary.  See the module docstring for what each step does.

    ``window_s``: seconds of offered load per run; ``drain_s``: extra seconds each run waits
    for open requests before cutting them.  ``overload``: offered rate over the engines'
    derived capacity.  ``preset``: replace the config's ``policy.preset`` (``None``: keep it).
    ``slos``: goodput's SLO per tier (``None``: the config's ``tiers[].slo``, else the
    simulator's default), in wall seconds at demo speed.  ``live``: draw the live view (only
    on a terminal; elsewhere a line every few seconds).  ``engine_args``: more ``velvetrope
    engine`` arguments for both engines, after the demo's own (e.g. ``("--set",
    "max_num_seqs=16")``); the workload's capacity is still derived from ``profile`` alone.
    """

    window_s: float = 20.0
    drain_s: float = 12.0
    speed: float = 3.0
    profile: str = "llama3-8b-a100"
    overload: float = 2.0
    trace: str = "azure_conv"
    trace_start_s: float = 600.0
    mix: str = "acme:interactive:0.2,globex:standard:0.3,initech:batch:0.5"
    seed: int = 7
    config_path: Path = DEFAULT_CONFIG
    preset: str | None = None
    out_dir: Path = Path("out")
    slos: Mapping[str, SloPolicy] | None = None
    live: bool = True
    poll_s: float = 0.25
    engine_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("window_s", "drain_s", "speed", "overload", "poll_s"):
            checks.number(name, getattr(self, name))
        if self.trace_start_s < 0:
            raise PolicyError(f"trace_start_s must be >= 0, got {self.trace_start_s}")
        if isinstance(self.engine_args, str):
            raise PolicyError("engine_args must be a sequence of arguments, not one string")
        object.__setattr__(self, "engine_args", tuple(self.engine_args))

    @classmethod
    def quick(cls, **overrides: Any) -> DemoSettings:
        """A few seconds per run (tests, smoke checks): 2 s window, 3 s drain, no live view."""
        return replace(cls(**overrides), **{**_QUICK, **overrides})

    def as_quick(self) -> DemoSettings:
        """These settings with the quick run's window, drain and no live view."""
        return replace(self, **_QUICK)


_QUICK: Mapping[str, Any] = {"window_s": 2.0, "drain_s": 3.0, "live": False, "poll_s": 0.2}


def read_config(path: Path) -> dict[str, Any]:
    """The gateway config at ``path`` as a YAML mapping, not yet validated; a
    :class:`ConfigError` naming the file when it is missing, unreadable or not a mapping."""
    if not path.exists():
        raise ConfigError(
            f"{path}: not found; the demo needs the example gateway config "
            "(shipped in the package; `velvetrope init` writes a copy) or --config FILE"
        )
    data = parse_yaml(read_text(path, "gateway config"), str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the gateway config must be a YAML mapping of fields")
    return data


def tenant_keys(config: Mapping[str, Any], path: Path) -> dict[str, str]:
    """Plain API keys by tenant (hashed keys cannot be sent)."""
    keys: dict[str, str] = {}
    for entry in config.get("api_keys") or ():
        if isinstance(entry, dict) and isinstance(entry.get("key"), str):
            keys.setdefault(str(entry["tenant"]), entry["key"])
    if not keys:
        raise ConfigError(f"{path}: api_keys: the demo needs plain `key:` entries to send")
    return keys
