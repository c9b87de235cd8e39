"""What the keys of ``velvetrope top`` change: the sort, the filter, quitting.

Sans-IO: :func:`press` takes the current :class:`Controls` and one key (a character as the
terminal sent it) and returns the new controls, or ``None`` to quit.  The keys:

==========  ==============================================================================
``s``       sort the tenants by the next column of :data:`SORTS`
``r``       reverse the order
``/`` ``f`` type a filter: Enter keeps it, Esc drops it, Backspace deletes a character
``Esc``     drop the filter
``q``       quit (Ctrl-C too)
==========  ==============================================================================

Any other key is ignored.  While a filter is typed every printable key is text (``q``
included); Enter or Esc ends the typing.

The filter keeps the tenants, the pools (with their bands and engines) and the other
buckets whose names contain its text, ignoring case; a kind of row none of whose names
contains it is shown whole (a tenant's name filters the tenants and leaves the pools).
See :func:`velvetrope.top.model.build_view`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["SORTS", "Controls", "press", "split_keys"]

SORTS = ("queued", "bucket", "rejected", "tenant")
"""The tenant table's sort columns, in the order ``s`` cycles through them: requests queued
(most first), token bucket fill (emptiest first), rejections per second (most first),
name (A first)."""

ESC = "\x1b"
_ENTER = ("\r", "\n")
_BACKSPACE = ("\x7f", "\b")
_QUIT = ("q", "\x03", "\x04")  # q, Ctrl-C, Ctrl-D
_MAX_FILTER = 40


@dataclass(frozen=True, slots=True)
class Controls:
    """The viewer's choices: the tenants' sort column (one of :data:`SORTS`) and direction,
    the filter text (``""``: none) and whether the filter is being typed."""

    sort: str = SORTS[0]
    reverse: bool = False
    filter: str = ""
    editing: bool = False


def press(c: Controls, key: str) -> Controls | None:
    """The controls after ``key`` (see the module docstring); ``None``: quit."""
    if c.editing:
        if key in _ENTER:
            return replace(c, editing=False)
        if key == ESC:
            return replace(c, editing=False, filter="")
        if key in _BACKSPACE:
            return replace(c, filter=c.filter[:-1])
        if key == "\x03":
            return None
        if key.isprintable() and len(c.filter) < _MAX_FILTER:
            return replace(c, filter=c.filter + key)
        return c
    if key in _QUIT:
        return None
    if key == "s":
        return replace(c, sort=SORTS[(SORTS.index(c.sort) + 1) % len(SORTS)])
    if key == "r":
        return replace(c, reverse=not c.reverse)
    if key in ("/", "f"):
        return replace(c, editing=True, filter="")
    if key == ESC:
        return replace(c, filter="")
    return c


def split_keys(data: str) -> list[str]:
    """The keys in what one read of the terminal returned: one character each, except an
    escape sequence (an arrow or function key: ``ESC [`` or ``ESC O`` and what follows up
    to its final letter or ``~``), which is dropped whole; a lone ``ESC`` is a key."""
    keys: list[str] = []
    i = 0
    while i < len(data):
        ch = data[i]
        if ch == ESC and i + 1 < len(data) and data[i + 1] in "[O":
            j = i + 2
            while j < len(data) and not (data[j].isalpha() or data[j] == "~"):
                j += 1
            i = j + 1
            continue
        keys.append(ch)
        i += 1
    return keys
