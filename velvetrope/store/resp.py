"""The RESP bytes of frequent script calls, from pre-encoded pieces.

:func:`~velvetrope.store.wire.pack` (hiredis) formats every argument of every call: each
number through ``repr``, each length through ``sprintf``, 2-3.5 µs for a reservation.  Most
of those arguments are the same call after call (the script's SHA, a tenant's bucket keys,
each claim's capacity, rate and floor, TTLs).  A :func:`template` is such a call packed once
with its few varying arguments left out; :func:`fill` puts the varying ones, each encoded by
:func:`number` or :func:`text`, back in between.  The bytes are exactly ``pack``'s for the
same arguments (tests compare them), in about a third of the time.

Numbers are encoded once per value and type (``1`` and ``1.0`` are different arguments) in
a bounded cache (emptied when full); zeros are not cached (``-0.0 == 0.0``, but they are
written differently).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Final

from velvetrope.store.wire import pack

__all__ = ["arg", "bulk", "evalsha", "fill", "number", "template", "text"]

_CACHED: Final = 4096  # numbers per type
_floats: Final[dict[float, bytes]] = {}  # Final: compiled, a C static, not a dict lookup
_ints: Final[dict[int, bytes]] = {}


def bulk(x: object) -> bytes:
    """One argument as ``pack`` writes it (a RESP bulk string)."""
    return pack(x)[4:]  # without "*1\r\n"


def number(x: int | float) -> bytes:
    """The bulk string of an int or a float, cached by value and type (``int | float``, not
    ``float``: compiled, a ``float`` parameter would turn an int into a float)."""
    t = type(x)
    cache: dict[Any, bytes] | None = _floats if t is float else _ints if t is int else None
    if cache is None:
        return bulk(x)  # a bool is refused there, as pack refuses it
    b = cache.get(x)
    if b is None:
        b = bulk(x)
        if x:
            if len(cache) >= _CACHED:
                cache.clear()  # the values of late follow the traffic
            cache[x] = b
    return b


def text(s: str) -> bytes:
    """The bulk string of ``s`` (UTF-8)."""
    b = s.encode()
    return b"$%d\r\n%b\r\n" % (len(b), b)


def arg(x: str | int | float) -> bytes:
    """The bulk string of a script argument: :func:`text` of a ``str``, else :func:`number`."""
    return text(x) if isinstance(x, str) else number(x)


def template(
    sha: str, keys: Sequence[Any], args: Sequence[Any], varying: Collection[int]
) -> list[bytes]:
    """``EVALSHA sha len(keys) *keys *args`` packed, cut at the arguments whose positions
    in ``keys + args`` are in ``varying``: the constant runs around them, one more than
    there are varying arguments."""
    runs: list[bytes] = []
    run = [b"*%d\r\n" % (3 + len(keys) + len(args)), bulk(b"EVALSHA"), bulk(sha), bulk(len(keys))]
    for i, a in enumerate((*keys, *args)):
        if i in varying:
            runs.append(b"".join(run))
            run = []
        else:
            run.append(bulk(a))
    runs.append(b"".join(run))
    return runs


def fill(runs: list[bytes], values: list[bytes]) -> bytes:
    """A :func:`template`'s call with the encoded varying arguments, in order (one fewer
    than ``runs``)."""
    parts = [runs[0]]
    for i in range(len(values)):
        parts.append(values[i])
        parts.append(runs[i + 1])
    return b"".join(parts)


def evalsha(sha: str, keys: list[bytes], args: list[bytes]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` with ``keys`` and ``args`` encoded already."""
    head = b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + len(keys) + len(args))
    return b"".join([head, bulk(sha), number(len(keys)), *keys, *args])
