"""``top``'s keys: what each changes, and how a terminal's bytes become keys."""

from __future__ import annotations

import pytest

from velvetrope.top import SORTS, Controls, press
from velvetrope.top.controls import split_keys


def typed(keys: str, start: Controls | None = None) -> Controls | None:
    """The controls after each key of ``keys`` in turn (``None`` once one quits)."""
    c: Controls | None = start or Controls()
    for k in keys:
        c = None if c is None else press(c, k)
    return c


def test_s_cycles_through_every_sort_column_and_back() -> None:
    seen = []
    c: Controls | None = Controls()
    for _ in SORTS:
        assert c is not None
        seen.append(c.sort)
        c = press(c, "s")
    assert seen == list(SORTS)
    assert c == Controls()


def test_r_reverses_and_reverses_back() -> None:
    assert typed("r") == Controls(reverse=True)
    assert typed("rr") == Controls()


@pytest.mark.parametrize("start", ["/", "f"])
def test_a_filter_is_typed_kept_and_cleared(start: str) -> None:
    assert typed(start + "acm") == Controls(filter="acm", editing=True)
    assert typed(start + "acmx\x7f") == Controls(filter="acm", editing=True)
    kept = typed(start + "acme\r")
    assert kept == Controls(filter="acme")
    assert typed("\x1b", kept) == Controls()
    assert typed(start + "acme\x1b") == Controls()
    assert typed(start + "sq\n") == Controls(filter="sq")  # keys are text while typing


def test_a_new_filter_starts_empty() -> None:
    assert typed("/b", Controls(filter="acme")) == Controls(filter="b", editing=True)


@pytest.mark.parametrize("keys", ["q", "\x03", "\x04", "sq", "/ab\rq", "/ab\x03"])
def test_quitting(keys: str) -> None:
    assert typed(keys) is None


def test_other_keys_change_nothing() -> None:
    assert typed("xyz\r\x7f") == Controls()
    assert typed("/\x01\x02") == Controls(editing=True)  # unprintable: not text


def test_escape_sequences_are_dropped_whole_and_a_lone_escape_is_a_key() -> None:
    assert split_keys("s\x1b[A\x1b[15~q") == ["s", "q"]
    assert split_keys("\x1bOPr") == ["r"]
    assert split_keys("\x1b") == ["\x1b"]
    assert split_keys("a\x1b") == ["a", "\x1b"]
    assert split_keys("é/") == ["é", "/"]
