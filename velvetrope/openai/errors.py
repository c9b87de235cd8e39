"""Errors in OpenAI's shape: ``{"error": {"message", "type", "code", "param"}}``.

One place builds every error both servers answer (the gateway and ``velvetrope engine``),
so the same mistake gets the same status, ``code``, ``param`` and message from either:

* :func:`error_body` / :func:`error_json`: the JSON bytes of an error response, with
  ``type`` derived from the HTTP status (:func:`error_type_for`) unless a
  :class:`~velvetrope.errors.RequestError` names its own;
* :func:`retry_headers`: ``x-should-retry: false`` on an error that the same request sent
  again cannot escape (the OpenAI SDKs read it before their own retry rules);
* the request-defect constructors (:func:`invalid_json`, :func:`not_an_object`,
  :func:`missing`, :func:`invalid_type`, :func:`invalid_value`, :func:`below_minimum`,
  :func:`above_maximum`, :func:`unknown_parameter`, :func:`nested_too_deep`): a 400
  :class:`~velvetrope.errors.RequestError` each, worded like OpenAI's API.
"""

from __future__ import annotations

from typing import Any

import orjson

from velvetrope.errors import RequestError

__all__ = [
    "NO_RETRY",
    "above_maximum",
    "below_minimum",
    "error_body",
    "error_json",
    "error_payload",
    "error_type_for",
    "invalid_json",
    "invalid_type",
    "invalid_value",
    "missing",
    "model_not_found",
    "nested_too_deep",
    "not_an_object",
    "retry_headers",
    "unknown_parameter",
]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "server_error",
    502: "upstream_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_type_for(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status (``api_error`` for one not listed)."""
    return _TYPES.get(status, "api_error")


def error_payload(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    error_type: str | None = None,
) -> dict[str, Any]:
    """The error object (``{"error": {...}}``); ``type`` from ``status`` unless given."""
    return {
        "error": {
            "message": message,
            "type": error_type or error_type_for(status),
            "code": code,
            "param": param,
        }
    }


_FINAL_STATUSES = frozenset({400, 401, 403, 404, 405, 413, 422})
"""Statuses whose answer the same request always gets again (the request's own defect, its
key, its path)."""

_FINAL_CODES = frozenset({"request_too_large"})
"""Codes that no wait changes although their status (429) says "later": a request larger
than its bucket can ever hold."""

NO_RETRY: tuple[bytes, bytes] = (b"x-should-retry", b"false")
"""The header that tells OpenAI's SDKs not to retry (they otherwise retry 408, 409, 429 and
every 5xx, and a connection broken before the answer)."""


def retry_headers(status: int, code: str | None = None) -> list[tuple[bytes, bytes]]:
    """``[x-should-retry: false]`` for an error answer that retrying cannot help: a status
    in 400, 401, 403, 404, 405, 413, 422, or a ``code`` such as ``request_too_large``;
    ``[]`` otherwise (the SDK's own rules then decide: 429, 503 and 5xx may pass later)."""
    if status in _FINAL_STATUSES or code in _FINAL_CODES:
        return [NO_RETRY]
    return []


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> bytes:
    """The JSON body of an error response."""
    return orjson.dumps(error_payload(status, message, code, param))


def error_json(exc: RequestError) -> bytes:
    """The JSON body answering ``exc`` (its status, code, param and, if set, type)."""
    return orjson.dumps(error_payload(exc.status, exc.message, exc.code, exc.param, exc.error_type))


# -- request defects (all 400) -----------------------------------------------------------------


_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int to Python, not to JSON
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _kind(value: object) -> str:
    """A JSON type name for ``value`` (``null``, ``boolean``, ``integer``, ``array``...)."""
    if value is None:
        return "null"
    return next((name for t, name in _JSON_TYPES if isinstance(value, t)), type(value).__name__)


def invalid_json(detail: str) -> RequestError:
    """The body is not JSON at all (``invalid_json``, no param)."""
    return RequestError(
        f"We could not parse the JSON body of your request: {detail}.", code="invalid_json"
    )


def not_an_object(value: object) -> RequestError:
    """The body is JSON but not an object (``invalid_type``, no param)."""
    return RequestError(
        f"The request body must be a JSON object, but got {_kind(value)} instead.",
        code="invalid_type",
    )


def missing(param: str) -> RequestError:
    """A required field is absent (``missing_required_parameter``)."""
    return RequestError(
        f"Missing required parameter: '{param}'.", code="missing_required_parameter", param=param
    )


def invalid_type(param: str, expected: str, value: object) -> RequestError:
    """``param`` has the wrong JSON type; ``expected`` reads like "an integer"."""
    return RequestError(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.",
        code="invalid_type",
        param=param,
    )


def invalid_value(param: str, message: str) -> RequestError:
    """``param`` has a value the server cannot use; ``message`` says why."""
    return RequestError(message, code="invalid_value", param=param)


def below_minimum(param: str, value: int, minimum: int) -> RequestError:
    """``param`` is below its minimum (``invalid_value``)."""
    return invalid_value(
        param, f"Invalid value for '{param}': {value} is less than the minimum of {minimum}."
    )


def above_maximum(param: str, value: int, maximum: int) -> RequestError:
    """``param`` is above its maximum (``invalid_value``)."""
    return invalid_value(
        param, f"Invalid value for '{param}': {value} is greater than the maximum of {maximum}."
    )


def unknown_parameter(key: str) -> RequestError:
    """A top-level field the server does not know (``unknown_parameter``)."""
    return RequestError(
        f"Unrecognized request argument supplied: {key}", code="unknown_parameter", param=key
    )


def model_not_found(model: str) -> RequestError:
    """An engine does not serve ``model`` (404 ``model_not_found``, OpenAI's wording)."""
    return RequestError(
        f"The model `{model}` does not exist or you do not have access to it.",
        status=404,
        code="model_not_found",
        param="model",
    )


def nested_too_deep(param: str | None, limit: int) -> RequestError:
    """JSON nested deeper than ``limit`` levels, under the top-level field ``param`` (or
    somewhere in the body: ``None``) (``invalid_value``)."""
    where = f"Invalid value for '{param}'" if param else "Invalid request body"
    return RequestError(
        f"{where}: JSON nested deeper than {limit} levels.", code="invalid_value", param=param
    )
