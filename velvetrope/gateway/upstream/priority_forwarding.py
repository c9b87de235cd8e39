"""How a job's tier reaches each upstream as the engine's own request ``priority``.

A pool with ``engine_priority`` (on by default) forwards each job's tier band (its index in
``policy.tiers``, 0 = the top tier; :class:`~velvetrope.core.engine_priority.EnginePriority`)
so that whatever an engine queues is ordered by tier too.  Engines read the field
differently, and some not at all; this module decides, per upstream, what is sent:

* ``low_first``: the band itself.  vLLM's ``--scheduling-policy priority`` serves lower
  values first.
* ``high_first``: minus the band (0 for the top tier, -1 for the next, ...).  SGLang's
  ``--enable-priority-scheduling`` serves larger values first unless it is started with
  ``--schedule-low-priority-values-first``.
* ``off``: nothing (the gateway strips a client's own ``priority`` in every case).

``upstreams.<pool>[].priority`` pins one of them; ``auto`` (the default) takes the engine's
dialect, pinned (``engine``) or detected from its ``/metrics``: ``high_first`` for
``sglang``, ``off`` for ``tgi``, ``trtllm`` and ``llamacpp`` (which have no such field),
``low_first`` for the rest (vLLM's convention, and our own ``velvetrope engine``'s).

**An engine that refuses the field.**  vLLM run FCFS answers 400 "Got priority 1 but
Priority scheduling is not enabled." to any nonzero priority (0 passes, so the top tier
never shows it); SGLang without priority scheduling may abort the request with 503 "Using
priority is disabled for this server"; an engine whose schema forbids unknown fields
answers 400 or 422 naming it.  An answer of 400, 422 or 503 whose body names ``priority``,
to a request that carried a nonzero one, is such a refusal (:meth:`learn`): the engine did
no work, so the request is sent again at once to the same upstream without the field, the
upstream is remembered as refusing it (logged once), and for ``REPROBE_S`` seconds nothing
is sent to it; then the next request carries the field again, and a success clears the
mark (an engine restarted in priority mode is found out).  While an upstream of a pool
refuses the field or is ``off``, the pool's engines do not order their queues by tier, and
the core's headroom rule is told so (:meth:`~velvetrope.core.AdmissionController.
engines_ordered`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from velvetrope.clock import Clock
from velvetrope.config import GatewayConfig
from velvetrope.config_sections import Upstream
from velvetrope.core import AdmissionController
from velvetrope.core.engine_priority import EnginePriority
from velvetrope.gateway.upstream.upstreams import UpstreamState

__all__ = ["REPROBE_S", "PriorityForwarding"]

log = logging.getLogger("velvetrope.gateway")

REPROBE_S: Final = 300.0
"""How long an upstream that refused the field is sent none before it is tried again."""

_REFUSALS: Final = frozenset({400, 422, 503})
_WITHOUT: Final = frozenset({"tgi", "trtllm", "llamacpp"})
"""Dialects of engines whose requests have no priority field."""


class PriorityForwarding:
    """The ``priority`` each upstream is sent; see the module docstring."""

    def __init__(
        self,
        config: GatewayConfig,
        ctl: AdmissionController,
        clock: Clock,
        spoken: Callable[[str], str | None],
    ) -> None:
        """``spoken(url)``: the dialect an upstream's metrics were last read in (``None``:
        not read, or not yet)."""
        self.ctl = ctl
        self.clock = clock
        self.spoken = spoken
        self._entries: dict[str, Upstream] = {}
        self._refusing: dict[str, float] = {}  # url -> when it last refused
        self._plain: dict[str, str] = {}  # url -> pool: upstreams sent no priority now
        self._rule_for = ctl.config
        self._rule = EnginePriority(ctl.config)
        self.reconfigure(config)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Take ``config``'s upstream entries (a reload); what was learned is kept."""
        self._entries = {u.url: u for ups in config.upstreams.values() for u in ups}

    def band(self, pool: str, tier: str) -> int | None:
        """The band a job of ``tier`` in ``pool`` forwards (``None``: the pool forwards
        none), by the policy in force (rebuilt after a reload)."""
        cfg = self.ctl.config
        if cfg is not self._rule_for:
            self._rule_for, self._rule = cfg, EnginePriority(cfg)
        return self._rule.of(pool, tier)

    def order(self, up: UpstreamState) -> str:
        """``low_first``, ``high_first`` or ``off`` for ``up``, before anything learned."""
        entry = self._entries.get(up.source or up.url)
        how = "auto" if entry is None else entry.priority
        if how != "auto":
            return how
        dialect = self.spoken(up.url)
        if dialect is None and entry is not None and entry.engine not in ("auto", "none"):
            dialect = entry.engine
        if dialect == "sglang":
            return "high_first"
        return "off" if dialect in _WITHOUT else "low_first"

    def state(self, up: UpstreamState, now: float) -> str:
        """How ``up`` is sent the tier now: ``low_first``, ``high_first``, ``off``, or
        ``refused`` (it refused the field less than ``REPROBE_S`` ago)."""
        refused = self._refusing.get(up.url)
        if refused is not None and now - refused < REPROBE_S:
            return "refused"
        return self.order(up)

    def wire(self, up: UpstreamState, band: int) -> int | None:
        """The value of ``priority`` to send ``up`` for a job of ``band`` (``None``: none)."""
        how = self.state(up, self.clock.now())
        self._mark(up, how not in ("off", "refused"))
        if how in ("off", "refused"):
            return None
        return -band if how == "high_first" else band

    def learn(self, up: UpstreamState, sent: int, status: int, body: bytes | None) -> bool:
        """``up`` answered ``status`` (``body``: a whole answer's bytes) to a request sent
        with ``priority`` = ``sent``: true when that was a refusal of the field (send the
        request again without it).  A success with a nonzero priority clears an earlier
        refusal."""
        if sent == 0:
            return False
        if status == 200:
            if self._refusing.pop(up.url, None) is not None:
                log.info("upstream %s takes the request priority again", up.url)
            return False
        if status not in _REFUSALS or not body or b"priority" not in body.lower():
            return False
        if up.url not in self._refusing:
            log.warning(
                "upstream %s refused the request priority (%d: %s); its requests go "
                "without it and the pool's engines no longer count as ordered by tier "
                "(vLLM: start it with --scheduling-policy priority; SGLang: "
                "--enable-priority-scheduling)",
                up.url,
                status,
                body[:160].decode("utf-8", "replace"),
            )
        self._refusing[up.url] = self.clock.now()
        self._mark(up, False)
        return True

    def _mark(self, up: UpstreamState, takes: bool) -> None:
        """Note whether ``up`` takes the field now; tell the core when its pool's engines
        start or stop all ordering their queues by tier (one dict lookup when nothing
        changed: every request asks)."""
        plain = self._plain
        if takes != (up.url in plain):
            return
        before = up.pool not in plain.values()
        if takes:
            del plain[up.url]
        else:
            plain[up.url] = up.pool
        after = up.pool not in plain.values()
        if after != before:
            self.ctl.engines_ordered(up.pool, after)
