"""The stream relay counts generated text from the bytes and parses only usage events: it
must account exactly what parsing every event does (what is settled: the engine's usage
when it sent one, else the text counted), for every server's chunk format and wherever the
stream is cut into pieces."""

from __future__ import annotations

import itertools
import json
import random

import orjson
import pytest

from velvetrope.core import Usage
from velvetrope.gateway.upstream.relay import UsageTally, body_tokens, relay_events
from velvetrope.openai.sse import (
    DONE,
    content_choices,
    content_keys,
    data_of,
    split_events,
    usage_at,
    usage_of,
)


def _compact(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _spaced(obj: object) -> bytes:  # json.dumps' default separators, as some servers use
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chat(content: object, n: int = 1, **extra: object) -> dict[str, object]:
    choices = [{"index": i, "delta": {"content": content}, "finish_reason": None} for i in range(n)]
    return {"id": "c1", "object": "chat.completion.chunk", "choices": choices, **extra}


TEXTS = [
    "hello",
    " world",
    "",
    "content",  # a value that is also a member name
    "text",
    'say "content":"x" and \\"text\\"',
    "\u00e9t\u00e9 \U0001f600",
    "\\",
]
USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}


def _streams() -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for name, enc in (("compact", _compact), ("spaced", _spaced)):
        role = {
            "id": "c1",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
        body = [enc(role)] + [enc(_chat(t)) for t in TEXTS]
        body += [enc(_chat(None)), enc({"id": "c1", "choices": [], "usage": USAGE}), DONE]
        out.append((f"chat-{name}", b"".join(body)))
        # OpenAI puts "usage": null in every chunk when include_usage is on
        nulls = [enc(_chat(t, usage=None)) for t in TEXTS]
        out.append(
            (
                f"chat-usage-null-{name}",
                b"".join([*nulls, enc({"choices": [], "usage": USAGE}), DONE]),
            )
        )
        # usage in the last content chunk (choices not empty), n = 2, logprobs, reasoning
        lp = {"content": [{"token": "a", "logprob": -0.1, "bytes": [97]}]}
        rich = [
            enc(_chat("a", n=2)),
            enc({"choices": [{"index": 0, "delta": {"content": "b"}, "logprobs": lp}]}),
            enc(
                {
                    "choices": [
                        {"index": 0, "delta": {"reasoning_content": "think", "content": None}}
                    ]
                }
            ),
            enc(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"tool_calls": [{"function": {"arguments": '{"text": 1}'}}]},
                        }
                    ]
                }
            ),
            enc(_chat("last", usage=USAGE)),
            DONE,
        ]
        out.append((f"chat-rich-{name}", b"".join(rich)))
        comp = [enc({"choices": [{"index": 0, "text": t, "logprobs": None}]}) for t in TEXTS]
        comp += [enc({"choices": [], "usage": USAGE}), DONE]
        out.append((f"completions-{name}", b"".join(comp)))
    out.append(("comments", b": ping\n\n" + _compact(_chat("x")) + b"event: noop\n\n" + DONE))
    # cut off before the usage (the engine died, the client left): the text counted is settled
    out += [
        (f"{name}-no-usage", b"".join(e for e in split_events(s)[0] if usage_at(e) < 0))
        for name, s in out
        if usage_at(s) >= 0
    ]
    return out


def _reference(stream: bytes, wants_usage: bool) -> tuple[object, object, bool, bytes]:
    """Parse every event (what the relay did before it counted from the bytes)."""
    relay = UsageTally(0)
    kept = []
    for e in split_events(stream)[0]:
        data = data_of(e)
        keep = True
        if data is not None and data != b"[DONE]":
            obj = orjson.loads(data)
            n = content_choices(obj)
            if n:
                relay.completion_tokens += n
                relay.first_token = True
            u = usage_of(obj)
            if u is not None:
                relay.usage = u
                keep = wants_usage or bool(obj.get("choices"))
        if keep:
            kept.append(e)
    return relay.usage_so_far(), relay.usage, relay.first_token, b"".join(kept)


def _relayed(pieces: list[bytes], wants_usage: bool) -> tuple[object, object, bool, bytes, int]:
    relay = UsageTally(0)
    firsts = 0

    def first() -> None:
        nonlocal firsts
        firsts += 1

    buf, out = b"", []
    for piece in pieces:  # as proxy.forward cuts them
        buf += piece
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            continue
        out.append(relay_events(buf[: cut + 2], relay, wants_usage, first))
        buf = buf[cut + 2 :]
    assert buf == b""
    return relay.usage_so_far(), relay.usage, relay.first_token, b"".join(out), firsts


@pytest.mark.parametrize(("name", "stream"), _streams(), ids=[n for n, _ in _streams()])
@pytest.mark.parametrize("wants_usage", [True, False])
def test_the_relay_accounts_like_parsing_every_event(
    name: str, stream: bytes, wants_usage: bool
) -> None:
    want = _reference(stream, wants_usage)
    rng = random.Random(name)
    cuts_list = [[], list(range(1, len(stream)))]  # whole, and byte by byte
    cuts_list += [
        sorted(rng.sample(range(1, len(stream)), k)) for k in (1, 3, 10) for _ in range(5)
    ]
    for cuts in cuts_list:
        bounds = [0, *cuts, len(stream)]
        pieces = [stream[a:b] for a, b in itertools.pairwise(bounds)]
        settled, usage, first, sent, firsts = _relayed(pieces, wants_usage)
        assert (settled, usage, first, sent) == want, (name, cuts)
        assert firsts == (1 if want[2] else 0)


def test_content_keys_and_usage_at() -> None:
    assert content_keys(b'{"choices":[{"delta":{"content":"a"}},{"delta":{"content":""}}]}') == 1
    assert content_keys(b'{"content" : "a", "text":"b", "text": ""}') == 2
    assert content_keys(b'{"reasoning_content":"a","context":"b","logprobs":{"content":[]}}') == 0
    assert content_keys(b'{"content":"he said \\"content\\":\\"x\\""}') == 1
    assert content_keys(b'{"content":"content"},{"text":"text"},{"content":null}') == 2
    assert content_keys(b'{"content":"a"},{"content":"b","logprobs":{"content":[]}}') == 2
    assert usage_at(b'{"usage": {"prompt_tokens": 1}}') == 1
    assert usage_at(b'{"usage":{},"x":{"usage" :\t{}}}') == 17  # the last one
    assert usage_at(b'{"usage":{},"x":{"usage":null}}') == -1  # the last one is null
    assert usage_at(b'{"usage":null,"choices":[]}') == -1
    assert usage_at(b'{"content":"the \\"usage\\":{ word"}') == -1
    assert usage_at(b'{"usage":{"n":1},"c":"usage"}') == 1  # a value "usage" is no member
    assert usage_at(b'{"a":"x"}') == -1


def test_split_events_keeps_the_rest() -> None:
    events, rest = split_events(b"data: 1\n\ndata: 2\n\ndata: 3")
    assert events == [b"data: 1\n\n", b"data: 2\n\n"] and rest == b"data: 3"


def test_usage_an_engine_under_reports_is_raised_to_what_passed_through() -> None:
    """Two choices of 2 tokens streamed, an engine usage that counts one of them."""
    relay = UsageTally(5)
    events = (
        b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
        b'data: {"choices":[{"index":1,"text":"b"}]}\n\n'
        b'data: {"choices":[{"index":0,"text":"c"}]}\n\n'
        b'data: {"choices":[{"index":1,"text":"d"}]}\n\n'
        b'data: {"choices":[{"index":1,"text":"","finish_reason":"length"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
    )
    firsts: list[int] = []
    relay_events(events, relay, True, lambda: firsts.append(1))
    assert relay.usage == Usage(7, 2)  # what the engine said, kept
    assert relay.usage_so_far() == Usage(7, 4)  # settled: the engine's prompt, 4 tokens seen
    assert firsts == [1]
    honest = UsageTally(5)
    relay_events(
        events.replace(b'"completion_tokens":2', b'"completion_tokens":9'),
        honest,
        True,
        lambda: None,
    )
    assert honest.usage_so_far() == Usage(7, 9)  # an engine that says more is believed


def test_a_whole_answer_shows_at_least_its_choices_tokens() -> None:
    two = {
        "choices": [
            {"index": 0, "text": "abc", "finish_reason": "length"},
            {"index": 1, "text": "abd", "finish_reason": "length"},
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 6},
    }
    assert body_tokens(two, 6) == 12
    assert body_tokens(two, 0) == 2  # max_tokens unknown: one token a choice with text
    chat = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
    assert body_tokens(chat, 50) == 1  # stopped early: at least one token, no more known
    assert body_tokens({"choices": [{"message": {"content": ""}}]}, 5) == 0
    assert body_tokens([], 5) == body_tokens({"choices": None}, 5) == 0
