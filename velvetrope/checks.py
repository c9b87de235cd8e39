"""Checking the numbers code passes in: a :class:`~velvetrope.errors.PolicyError` that names
the argument and shows what it got.

* :func:`number`: an ``int`` or ``float`` (not a ``bool``), finite, above a bound (or at
  it, with ``strict=False``); returned as a ``float``;
* :func:`count`: an integer (numpy's included; not a ``bool`` nor a ``float``) at least a
  minimum; returned as an ``int``.
"""

from __future__ import annotations

import math
import operator

from velvetrope.errors import PolicyError

__all__ = ["count", "number"]


def number(name: str, value: object, *, minimum: float = 0.0, strict: bool = True) -> float:
    """``value`` as a finite ``float`` ``> minimum`` (``>= minimum`` when not ``strict``).

    Raises :class:`PolicyError`: ``<name> must be a number, got <value>`` or ``<name> must be
    finite and > <minimum>, got <value>``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < minimum or (strict and v == minimum):
        raise PolicyError(
            f"{name} must be finite and {'>' if strict else '>='} {minimum:g}, got {value!r}"
        )
    return v


def count(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as an ``int >= minimum``.

    Raises :class:`PolicyError`: ``<name> must be an integer, got <value>`` or ``<name> must
    be >= <minimum>, got <value>``."""
    if isinstance(value, bool):
        raise PolicyError(f"{name} must be an integer, got {value!r}")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise PolicyError(f"{name} must be an integer, got {value!r}") from None
    if n < minimum:
        raise PolicyError(f"{name} must be >= {minimum}, got {n}")
    return int(n)
