"""What a replay of :mod:`velvetrope.demo.loadgen` sends and how its clients behave: the
servers, keys, model, bounds and engine priorities of a run (:class:`ReplayConfig`), and one
request's client (:class:`ClientPlan`: stream or not, hang up on purpose).  Bad arguments
raise :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from velvetrope import checks
from velvetrope.errors import PolicyError

__all__ = ["DEFAULT_MODEL", "ClientPlan", "ReplayConfig"]

DEFAULT_MODEL = "velvetrope-sim"
"""The model name ``velvetrope engine`` serves by default."""


@dataclass(frozen=True, slots=True)
class ClientPlan:
    """How the client of one request behaves.

    ``stream``: ask for server-sent events (else one JSON answer, whose ``usage`` gives
    ``tokens``; its time to first token is then its end-to-end time).  ``hang_up_after_s``:
    close the connection this many seconds after sending if the request is still open (before
    the answer's head, that is a client leaving the queue).  ``hang_up_after_tokens``: close
    it once that many tokens have streamed (streaming only).  A plan whose hang-up never
    comes (the answer ended first) leaves the request's outcome as it would be without it.
    """

    stream: bool = True
    hang_up_after_s: float | None = None
    hang_up_after_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.hang_up_after_s is not None and not self.hang_up_after_s > 0:
            raise PolicyError(f"hang_up_after_s must be > 0, got {self.hang_up_after_s}")
        if self.hang_up_after_tokens is not None:
            if not self.stream:
                raise PolicyError("hang_up_after_tokens needs a streaming client")
            if self.hang_up_after_tokens < 1:
                raise PolicyError(
                    f"hang_up_after_tokens must be >= 1, got {self.hang_up_after_tokens}"
                )


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """Where and how to send a workload.

    ``api_keys`` is one key for every tenant, or a mapping tenant -> key (every tenant of
    the workload must be in it).  ``deadline_s`` bounds the whole run from its start;
    ``request_timeout_s`` bounds each request from its send.  ``max_connections`` caps
    open sockets (aiohttp's connector limit).  ``priorities``: tier -> the ``priority``
    field each request of that tier carries (every tier of the workload must be in it;
    ``None``: no request carries one).  ``tier_headers``: tier -> extra HTTP headers each
    request of that tier carries (a peer gateway's class header, say; a tier not in it
    carries none).
    """

    base_urls: tuple[str, ...]
    api_keys: str | Mapping[str, str] = "sk-none"
    model: str = DEFAULT_MODEL
    deadline_s: float = 120.0
    request_timeout_s: float = 60.0
    max_connections: int = 1024
    priorities: Mapping[str, int] | None = None
    tier_headers: Mapping[str, Mapping[str, str]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.base_urls, str) or not self.base_urls:
            raise PolicyError("base_urls must be a non-empty sequence of URLs")
        object.__setattr__(self, "base_urls", tuple(u.rstrip("/") for u in self.base_urls))
        for name in ("deadline_s", "request_timeout_s"):
            checks.number(name, getattr(self, name))
        if self.max_connections < 1:
            raise PolicyError(f"max_connections must be >= 1, got {self.max_connections}")

    def key_for(self, tenant: str) -> str:
        """The API key to send for ``tenant``; PolicyError if a mapping lacks it."""
        if isinstance(self.api_keys, str):
            return self.api_keys
        try:
            return self.api_keys[tenant]
        except KeyError:
            raise PolicyError(f"no API key for tenant {tenant!r}") from None

    def priority_for(self, tier: str | None) -> int | None:
        """The ``priority`` to send for a request of ``tier`` (``None``: send none);
        PolicyError if ``priorities`` lacks the tier."""
        if self.priorities is None:
            return None
        if tier is None or tier not in self.priorities:
            raise PolicyError(f"no engine priority for tier {tier!r}")
        return self.priorities[tier]

    def headers_for(self, tier: str | None) -> Mapping[str, str]:
        """The extra headers a request of ``tier`` carries (none unless ``tier_headers``
        names the tier)."""
        if self.tier_headers is None or tier is None:
            return {}
        return self.tier_headers.get(tier, {})
