"""Errors in OpenAI's shape: ``{"error": {"message", "type", "code", "param"}}``."""

from __future__ import annotations

import orjson

__all__ = ["error_body", "error_type_for"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    502: "upstream_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_type_for(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status."""
    return _TYPES.get(status, "api_error")


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> bytes:
    """The JSON body of an error response."""
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": error_type_for(status),
                "code": code,
                "param": param,
            }
        }
    )
