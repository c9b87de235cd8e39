"""One exception tree for the whole package.

::

    VelvetropeError
    ├── ConfigError                 a configuration that cannot be used (names file and field)
    ├── PolicyError                 an unknown policy/preset/profile name or bad parameters
    ├── LifecycleError              an illegal job state transition
    │   └── UnknownJobError         an event names a job the controller does not hold
    ├── RequestError                a client request that cannot be served (carries HTTP status)
    ├── ClientDisconnected          the client went away before its request was read
    ├── UpstreamError               an upstream engine failed or answered badly (502)
    │   ├── UpstreamUnreachable     nothing reached the upstream (safe to try another)
    │   └── UpstreamTimeout         an upstream did not answer in time (504)
    ├── StoreError                  shared state (Redis) misbehaved
    │   └── StoreUnavailable        shared state cannot be reached (503)
    ├── TraceError                  a trace or workload file cannot be read
    └── MissingExtra                an optional dependency is not installed (names the extra)

Every error carries a human-readable message; the gateway maps each to OpenAI's error shape.
"""

from __future__ import annotations

__all__ = [
    "ClientDisconnected",
    "ConfigError",
    "LifecycleError",
    "MissingExtra",
    "PolicyError",
    "RequestError",
    "StoreError",
    "StoreUnavailable",
    "TraceError",
    "UnknownJobError",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "VelvetropeError",
]


class VelvetropeError(Exception):
    """Root of every error raised by velvetrope."""


class ConfigError(VelvetropeError):
    """A configuration cannot be used.  The message names the file and the field."""


class PolicyError(VelvetropeError):
    """An unknown policy, preset or profile name, or parameters out of range."""


class LifecycleError(VelvetropeError):
    """An event would move a job through an illegal state transition."""


class UnknownJobError(LifecycleError):
    """An event names a job id the controller does not (or no longer) hold."""


class RequestError(VelvetropeError):
    """A client request that cannot be served as sent.

    ``status`` is the HTTP status, ``code`` OpenAI's machine-readable code and ``param``
    the offending field, when one is to blame.  ``error_type`` is OpenAI's ``type``;
    ``None`` lets the answer derive it from the status
    (:func:`velvetrope.openai.errors.error_type_for`).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        code: str = "invalid_request_error",
        param: str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param
        self.error_type = error_type


class ClientDisconnected(VelvetropeError):
    """The client disconnected before its request body was read: nothing to answer."""


class UpstreamError(VelvetropeError):
    """An upstream engine failed or answered with something unusable (maps to 502)."""


class UpstreamUnreachable(UpstreamError):
    """The upstream could not be reached: no work started, another upstream may be tried."""


class UpstreamTimeout(UpstreamError):
    """An upstream engine did not answer in time (maps to 504)."""


class StoreError(VelvetropeError):
    """Shared state misbehaved (a script error, a corrupt value)."""


class StoreUnavailable(StoreError):
    """Shared state cannot be reached (maps to 503)."""


class TraceError(VelvetropeError):
    """A trace or workload file cannot be read; the message names the file and line."""


class MissingExtra(VelvetropeError):
    """A command needs a package that only an optional extra installs.

    ``module`` is the missing top-level module, ``extra`` the extra of the ``velvetrope``
    distribution that brings it; the message says ``install 'velvetrope[extra]'``.
    """

    def __init__(self, what: str, module: str, extra: str) -> None:
        super().__init__(
            f"{what} needs the {module!r} package, which the base install leaves out: "
            f"install 'velvetrope[{extra}]'"
        )
        self.module = module
        self.extra = extra
