"""A large input that many tasks share: pickled once, unpickled once per process.

A sweep's points all take the same workload (tens of thousands of requests).  Passed as is,
an executor pickles it again for every task and every worker unpickles it for every task;
wrapped in a :class:`Shared` it is pickled once, each task carries one opaque byte string
(copied, not traversed), and a worker process unpickles it for its first task only.
Pure Python, no dependency beyond the standard library.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from typing import Generic, TypeVar, cast

__all__ = ["Shared"]

T = TypeVar("T")

_UNPICKLED: OrderedDict[str, object] = OrderedDict()
_KEEP = 4  # distinct shared inputs a worker process keeps unpickled


class Shared(Generic[T]):
    """``value`` pickled once; :meth:`get` unpickles it at most once per process.

    A task argument that many tasks share: pickling a :class:`Shared` copies its byte
    string (no walk over the object graph), and :meth:`get` in a worker returns the object
    it unpickled for an earlier task with the same bytes (the last few distinct inputs are
    kept, keyed by their SHA-256).  The value must not be mutated by its users: tasks in
    one worker share one copy.  In the process that made it, :meth:`get` returns ``value``
    itself.
    """

    __slots__ = ("_blob", "_here", "_key", "_value")

    def __init__(self, value: T) -> None:
        self._blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        self._key = hashlib.sha256(self._blob).hexdigest()
        self._value = value
        self._here = True

    @property
    def nbytes(self) -> int:
        """Size of the pickled value: what each task ships."""
        return len(self._blob)

    def get(self) -> T:
        """The value (unpickled here at most once per process for these bytes)."""
        if self._here:
            return self._value
        if self._key in _UNPICKLED:
            hit = _UNPICKLED[self._key]
            _UNPICKLED.move_to_end(self._key)
        else:
            hit = pickle.loads(self._blob)
            _UNPICKLED[self._key] = hit
            while len(_UNPICKLED) > _KEEP:
                _UNPICKLED.popitem(last=False)
        self._value = cast(T, hit)
        self._here = True
        return self._value

    def __getstate__(self) -> tuple[bytes, str]:
        return (self._blob, self._key)

    def __setstate__(self, state: tuple[bytes, str]) -> None:
        self._blob, self._key = state
        self._here = False
