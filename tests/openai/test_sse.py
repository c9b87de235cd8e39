"""Reading SSE as the spec defines it (html.spec.whatwg.org, "Server-sent events"): lines end
with ``\\n``, ``\\r\\n`` or ``\\r``; an event is dispatched at a blank line; comments and other
fields are skipped; several ``data`` lines join with ``\\n``.  The splitter is checked
against a reference reader written from the spec, for every way a stream can be cut."""

from __future__ import annotations

import random
import re
from functools import partial

import pytest

from velvetrope.core import Usage
from velvetrope.gateway.upstream.relay import UsageTally, relay_events
from velvetrope.openai.sse import event_data, split_complete, split_events

_LINE = re.compile(rb"([^\r\n]*)(\r\n|\r|\n)")


def reference(stream: bytes) -> list[bytes]:
    """The data of each event the spec's reader dispatches from ``stream`` (a trailing
    ``\\r`` ends its line, as the spec says)."""
    events: list[bytes] = []
    data: list[bytes] | None = None
    for m in _LINE.finditer(stream):
        line = m.group(1)
        if not line:
            if data is not None:
                events.append(b"\n".join(data))
            data = None
            continue
        if line.startswith(b":"):
            continue
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data = [*(data or []), value]
    return events


def relayed(pieces: list[bytes]) -> tuple[list[bytes], list[int]]:
    """The data of the events :func:`split_events` gives for ``pieces`` arriving one by
    one, and how many had been given after each piece."""
    out: list[bytes] = []
    counts: list[int] = []
    rest = b""
    for piece in pieces:
        events, rest = split_events(rest + piece)
        for ev in events:
            assert b"\r" not in ev  # the relay sends \n line ends on
            data = event_data(ev)
            if data is not None:
                out.append(data)
        counts.append(len(out))
    return out, counts


STREAM = (
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    b": keep-alive comment\n\n"
    b'event: message\nid: 7\ndata: {"choices":\ndata: [{"delta":{"content":"b"}}]}\n\n'
    b"data\n\n"
    b"data:no space\n\n"
    b"retry: 100\n\n"
    b'data: {"usage":{"prompt_tokens":3,"completion_tokens":2},"choices":[]}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_every_cut_gives_the_events_of_the_spec_as_soon_as_they_are_complete(
    line_end: bytes,
) -> None:
    stream = STREAM.replace(b"\n", line_end)
    want = reference(stream)
    assert len(want) == 6 and want[1] == b'{"choices":\n[{"delta":{"content":"b"}}]}'
    for cut in range(len(stream) + 1):
        got, counts = relayed([stream[:cut], stream[cut:]])
        assert got == want, cut
        assert counts[0] == len(reference(stream[:cut])), cut  # nothing waits for more bytes
    rng = random.Random(7)
    for _ in range(200):  # many cuts at once, and a mix of line ends
        mixed = b"".join(
            rng.choice((b"\n", b"\r\n", b"\r")) if c == b"\n"[0] else bytes([c]) for c in STREAM
        )
        cuts = sorted(rng.sample(range(1, len(mixed)), 12))
        pieces = [mixed[a:b] for a, b in zip([0, *cuts], [*cuts, len(mixed)], strict=True)]
        got, counts = relayed(pieces)
        assert got == reference(mixed)
        ends = [sum(len(p) for p in pieces[: i + 1]) for i in range(len(pieces))]
        assert counts == [len(reference(mixed[:e])) for e in ends]


def test_the_common_stream_is_passed_as_it_is() -> None:
    done, rest = split_complete(STREAM)
    assert done is STREAM and rest == b""  # no copy
    assert split_complete(b"data: 1\n\ndata: 2") == (b"data: 1\n\n", b"data: 2")


def test_a_held_cr_completes_its_event_at_once_and_its_lf_is_dropped() -> None:
    assert split_complete(b"data: 1\r\n\r") == (b"data: 1\n\n", b"\r")
    assert split_complete(b"\r\ndata: 2\r\n\r\n") == (b"data: 2\n\n", b"")
    assert split_complete(b"data: 1\r") == (b"", b"data: 1\r")  # maybe a \r\n: wait
    assert split_complete(b"data: 1\r\ndata: 2\r\n") == (b"", b"data: 1\ndata: 2\n")


def test_event_data() -> None:
    assert event_data(b"data: x\n\n") == b"x"
    assert event_data(b": comment\n\n") is None
    assert event_data(b"event: e\ndata:  two spaces\ndata\n\n") == b" two spaces\n"


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_the_relay_reads_usage_in_any_framing(line_end: bytes) -> None:
    stream = STREAM.replace(b"\n", line_end)
    for wants in (False, True):
        tally = UsageTally(3)
        seen: list[int] = []
        out = b""
        rest = b""
        for i in range(0, len(stream), 5):
            done, rest = split_complete(rest + stream[i : i + 5])
            if done:
                out += relay_events(done, tally, wants, partial(seen.append, 1))
        assert tally.usage == Usage(3, 2) and seen == [1]
        assert (b'"usage":{' in out) is wants  # dropped unless asked for
        assert out.endswith(b"data: [DONE]\n\n")


def test_a_usage_event_of_several_lines_is_read() -> None:
    tally = UsageTally(1)
    data = (
        b': c\n\ndata: {"choices":[],\ndata: "usage":{"prompt_tokens":4,"completion_tokens":5}}\n\n'
    )
    out = relay_events(data, tally, False, lambda: None)
    assert tally.usage == Usage(4, 5)
    assert out == b": c\n\n"
    tally = UsageTally(1)
    lead = b'\ndata: {"usage":{"prompt_tokens":4,"completion_tokens":6}}\n\n'
    assert relay_events(lead, tally, True, lambda: None) == lead
    assert tally.usage == Usage(4, 6)
