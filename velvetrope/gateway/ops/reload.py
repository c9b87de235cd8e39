"""Reloading the gateway's configuration file without a restart.

Triggers: ``SIGHUP``, ``POST /admin/reload`` (with the admin token) and, with
``gateway.reload_watch_s``, a poll of the file's content (a Kubernetes ConfigMap mounted as
a volume is updated in place, by a symlink swap, within the kubelet's sync period).

A reload reads and validates the whole file first (:func:`~velvetrope.config.load_config`,
the policy built once on a throwaway controller, every upstream's access settings).  On any
error the running configuration stays and the reason is said three ways: a log line, the
metric ``velvetrope_config_reload_total{result="invalid"}`` and the admin response (400
``invalid_config``).  A file that changes what only a restart can change (``listen``,
``state``, ``gateway``, and the policy settings :func:`~velvetrope.core.reload.
restart_needed` names) is refused the same way (409 ``needs_restart``,
``result="needs_restart"``), naming the settings.

Otherwise it is applied at once, between two events of the event loop, so no request sees
half of it (:meth:`~velvetrope.core.controller.AdmissionController.reconfigure`): queued and
in-flight requests go on; bucket levels carry over (a raised limit refills from the current
level, a lowered one clips it, at each bucket's next use); new tenants, keys, tiers, pools
and upstreams appear; the queued requests of a removed tenant (no longer in the policy, or
whose last API key was removed), tier or pool are rejected with 503 ``removed_by_reload``,
its in-flight ones finish; the adaptive limits, the output predictor and fairness counters
are kept; budgets and prices change for requests admitted from then on, their usage so far
kept (:class:`~velvetrope.gateway.driver.quotas.Quotas`).  With Redis state each replica applies
the file it reads: limits are passed with every Redis call, so replicas agree once each has
reloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from velvetrope.clock import ManualClock
from velvetrope.config import ConfigSource, GatewayConfig
from velvetrope.core import AdmissionController, apply_preset
from velvetrope.core.reload import restart_needed
from velvetrope.errors import ConfigError, PolicyError
from velvetrope.gateway.driver.admission import Admission
from velvetrope.gateway.driver.quotas import Quotas
from velvetrope.gateway.ops.metrics import GatewayMetrics
from velvetrope.gateway.upstream.engines import Engines
from velvetrope.gateway.upstream.upstream_access import check_access
from velvetrope.gateway.upstream.upstreams import Periodic

__all__ = ["ReloadResult", "Reloadable", "Reloader"]

log = logging.getLogger("velvetrope.gateway")

_RESTART_SECTIONS = ("listen", "state", "gateway")


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a reload did: ``result`` is ``ok``, ``invalid`` or ``needs_restart``."""

    result: str
    message: str
    changes: tuple[str, ...] = field(default=())
    took_ms: float = 0.0
    """Reading, validating and applying the file, in milliseconds."""

    @property
    def status(self) -> int:
        """The admin response's HTTP status."""
        return {"ok": 200, "invalid": 400}.get(self.result, 409)

    @property
    def code(self) -> str:
        """OpenAI-style error code (``ok`` for a success)."""
        return {"ok": "ok", "invalid": "invalid_config"}.get(self.result, "needs_restart")


class Reloadable(Protocol):
    """What a reload changes in a gateway (:class:`~velvetrope.gateway.api.app.Gateway`)."""

    config: GatewayConfig
    ctl: AdmissionController
    engines: Engines
    keys: dict[str, str]
    admin_token: str | None
    admission: Admission
    metrics: GatewayMetrics
    quotas: Quotas


class Reloader:
    """Reloads ``gateway``'s configuration from ``source`` (``None``: the gateway was
    started from a config object; every reload is refused)."""

    def __init__(self, gateway: Reloadable, source: ConfigSource | None) -> None:
        self.gateway = gateway
        self.source = source
        self.path = None if source is None else source.path
        self._seen = self._digest()
        self._watch = Periodic()
        self.last: ReloadResult | None = None

    def _digest(self) -> bytes | None:
        if self.path is None:
            return None
        try:
            return hashlib.sha256(Path(self.path).read_bytes()).digest()
        except OSError:
            return None

    def start(self, watch_s: float | None) -> None:
        """In the running loop: reload on SIGHUP (main thread only) and, with ``watch_s``,
        when the file's content changes."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        if watch_s is not None and self.path is not None:
            self._watch.start(self._poll, watch_s)

    async def stop(self) -> None:
        await self._watch.stop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    async def _poll(self) -> None:
        digest = self._digest()
        if digest is not None and digest != self._seen:
            self.reload()

    def reload(self) -> ReloadResult:
        """Read the file and apply it (see the module docstring); log and count the result."""
        started = time.perf_counter()
        self._seen = self._digest()
        if self.source is None:
            result = ReloadResult("invalid", "the gateway was not started from a config file")
        else:
            try:
                result = self.apply(self.source.load())
            except ConfigError as e:
                result = ReloadResult("invalid", str(e))
        result = dataclasses.replace(result, took_ms=(time.perf_counter() - started) * 1e3)
        self.last = result
        self.gateway.metrics.reloads.labels(result.result).inc()
        if result.result == "ok":
            log.warning("velvetrope: config reloaded from %s: %s", self.path, result.message)
        else:
            log.error("velvetrope: config reload refused (%s): %s", result.result, result.message)
        return result

    def apply(self, new: GatewayConfig) -> ReloadResult:
        """Validate ``new`` against the running configuration and apply it, or change
        nothing and say why."""
        gw = self.gateway
        old = gw.config
        needs = [f for s in _RESTART_SECTIONS for f in _differing(s, old, new)]
        try:
            policy = apply_preset(new.policy)
            AdmissionController(policy, ManualClock())  # every policy check, on a throwaway
            check_access(new)
        except (ConfigError, PolicyError) as e:
            return ReloadResult("invalid", str(e))
        needs += restart_needed(gw.ctl.config, policy)
        if needs:
            return ReloadResult("needs_restart", "needs a restart to change: " + ", ".join(needs))
        changes = _changes(old, new)
        keyed = {k.tenant for k in old.api_keys}
        gone = keyed - {k.tenant for k in new.api_keys}
        removed = gw.admission.reloaded(policy, gone)
        gw.engines.reconfigure(new)
        gw.keys = {k.digest: k.tenant for k in new.api_keys}
        gw.admin_token = new.resolved_admin_token()
        gw.quotas.reconfigure(new.quotas)
        gw.config = new
        gw.admission.pump()
        if removed:
            changes.append(f"{removed} queued requests rejected (removed_by_reload)")
        return ReloadResult("ok", "; ".join(changes) or "no change", tuple(changes))


def _differing(section: str, old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The settings of ``section`` that differ between ``old`` and ``new``, each named
    ``section.field`` (``gateway.other_paths``); the section alone when it is no model."""
    a, b = getattr(old, section), getattr(new, section)
    if a == b:
        return []
    names = getattr(type(a), "model_fields", None)
    if names is None or type(a) is not type(b):
        return [section]
    return [f"{section}.{f}" for f in names if getattr(a, f) != getattr(b, f)] or [section]


def _changes(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """What differs, in words an operator reads in a log line."""
    out: list[str] = []

    def named(label: str, a: dict[str, object], b: dict[str, object]) -> None:
        added = sorted(b.keys() - a.keys())
        removed = sorted(a.keys() - b.keys())
        changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
        for verb, names in (("added", added), ("removed", removed), ("changed", changed)):
            if names:
                out.append(f"{label} {verb}: {', '.join(names)}")

    po, pn = old.policy, new.policy
    named("tenants", {t.name: t for t in po.tenants}, {t.name: t for t in pn.tenants})
    named("tiers", {t.name: t for t in po.tiers}, {t.name: t for t in pn.tiers})
    named("pools", {p.name: p for p in po.pools}, {p.name: p for p in pn.pools})
    named("upstreams", dict(old.upstreams), dict(new.upstreams))
    if {k.digest for k in old.api_keys} != {k.digest for k in new.api_keys}:
        out.append(f"api_keys: {len(old.api_keys)} -> {len(new.api_keys)}")
    for name in ("routes", "models", "default_tenant", "queue"):
        if getattr(po, name) != getattr(pn, name):
            out.append(f"policy.{name} changed")
    if [t.name for t in po.tiers] != [t.name for t in pn.tiers] and not any(
        s.startswith("tiers ") for s in out
    ):
        out.append("tiers reordered")
    if old.resolved_admin_token() != new.resolved_admin_token():
        out.append("admin token changed")
    if old.quotas != new.quotas:
        out.append("quotas changed")
    return out
