"""YAML files validated by a pydantic model, with errors that name the file and the field.

Every YAML input of velvetrope (the gateway's config, an engine profile, a planner
workload) is read the same way: the text (:func:`read_text`), the YAML document
(:func:`parse_yaml`), then the model (:func:`validate`); :func:`load_model` is the last two
in one call.  Each step raises :class:`~velvetrope.errors.ConfigError` with a message that
starts with the source (a file's path, or a name such as ``built-in profile x.yaml``):

* ``<file>: <what> file not found`` / ``<file>: cannot read <what> file: <reason>``;
* ``<source>: not valid YAML: <parser's message with line and column>``;
* ``<source>: <what> must be a YAML mapping of fields (<fields>), got <type>``;
* ``<source>: invalid <what>: <problems>``, the problems as :func:`describe` words them.

This module imports only PyYAML, pydantic and :mod:`velvetrope.errors`, so the gateway can
use it without loading anything else of ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from velvetrope.errors import ConfigError

__all__ = ["describe", "load_model", "parse_yaml", "read_text", "reject_bool", "validate"]

M = TypeVar("M", bound=BaseModel)


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``; a :class:`ConfigError` naming it (``what`` says what the
    file should hold, e.g. ``"workload"``) when it is missing or cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read {what} file: {exc}") from None


def parse_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text`` (``None`` for an empty one); a :class:`ConfigError`
    starting with ``source`` and giving the parser's position when it is not YAML."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None


def validate(model: type[M], data: Any, source: str, what: str) -> M:
    """``data`` validated as ``model``; a :class:`ConfigError` starting with ``source`` when
    it is not a mapping or does not validate (every problem named by its field)."""
    if not isinstance(data, dict):
        got = "an empty document" if data is None else type(data).__name__
        raise ConfigError(
            f"{source}: {what} must be a YAML mapping of fields "
            f"({', '.join(model.model_fields)}), got {got}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid {what}: {describe(exc, model)}") from None


def load_model(model: type[M], text: str, source: str, what: str) -> M:
    """The YAML document in ``text`` validated as ``model``: :func:`parse_yaml`, then
    :func:`validate`, with their errors."""
    return validate(model, parse_yaml(text, source), source, what)


def reject_bool(value: object) -> object:
    """``value`` unless it is a ``bool``: a ``BeforeValidator`` for a number field, where
    pydantic's lax mode would read YAML's ``yes``/``true`` as 1 (a ``ValueError`` instead)."""
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


def describe(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """``exc``'s problems in one line, separated by ``;``, each naming its field by its path
    (``field 'a.0.b': <message> (got <value>)``, the value shown when it is a scalar).

    An unknown field is ``unknown field 'x'``, followed by ``model``'s fields when given and
    ``x`` is at the top level; a missing one is ``field 'x': required but missing``; a
    problem with the whole document (a model validator's) is its message alone."""
    parts = []
    for err in exc.errors():
        loc = err["loc"]
        field = ".".join(str(p) for p in loc)
        msg = err["msg"].removeprefix("Value error, ")
        kind = err["type"]
        if kind == "extra_forbidden":
            known = ""
            if model is not None and len(loc) == 1:
                known = f" (known fields: {', '.join(model.model_fields)})"
            parts.append(f"unknown field {field!r}{known}")
        elif kind == "missing":
            parts.append(f"field {field!r}: required but missing")
        elif not field:
            parts.append(msg)
        else:
            if kind in ("model_type", "dict_type"):
                msg = "expected a mapping of fields"
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            parts.append(f"field {field!r}: {msg}{shown}")
    return "; ".join(parts)
