"""Request parsing and the body the upstream sees (unit level; HTTP cases in test_admission)."""

from __future__ import annotations

import orjson
import pytest

from velvetrope.errors import RequestError
from velvetrope.gateway.api.parse import Kind, parse_request


def words(text: str) -> int:
    return len(text.split())


def test_a_plain_body_passes_through_byte_for_byte() -> None:
    raw = b'{"model":"m","prompt":"one two three","max_tokens":5}'
    p = parse_request(raw, "completions", max_tokens_limit=100, count_text=words)
    assert (p.model, p.stream, p.max_tokens, p.prompt_tokens, p.n) == ("m", False, 5, 3, 1)
    assert p.upstream_body() is raw


def test_streams_always_ask_for_usage_and_client_priority_is_stripped() -> None:
    raw = b'{"model":"m","prompt":"x","stream":true,"priority":-100}'
    p = parse_request(raw, "completions", max_tokens_limit=100, count_text=words)
    assert p.stream
    assert not p.client_wants_usage
    sent = orjson.loads(p.upstream_body())
    assert sent["stream_options"] == {"include_usage": True}
    assert "priority" not in sent


def test_chat_counts_every_message_and_honours_max_completion_tokens() -> None:
    raw = orjson.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a b c"}]},
            ],
            "max_tokens": 50,
            "max_completion_tokens": 20,
            "n": 3,
        }
    )
    p = parse_request(raw, "chat", max_tokens_limit=100, count_text=words)
    assert p.prompt_tokens == (2 + 4) + (3 + 4) + 3
    assert p.max_tokens == 20  # the tighter of the two
    assert p.n == 3


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model":"m","prompt":"x","n":0}', "n"),
        (b'{"model":"m","messages":[]}', "messages"),
        (b'{"model":"m","messages":["hi"]}', "messages[0]"),
        (b'{"model":"m","messages":[{"content":"hi"}]}', "messages[0].role"),
        (b'{"model":"m","prompt":"x","stream_options":3}', "stream_options"),
        (b'{"model":"m","prompt":[]}', "prompt"),
        (b'{"model":"m","prompt":"x","max_tokens":true}', "max_tokens"),
    ],
)
def test_defects_name_their_param(raw: bytes, param: str) -> None:
    kind: Kind = "chat" if b"messages" in raw else "completions"
    with pytest.raises(RequestError) as ei:
        parse_request(raw, kind, max_tokens_limit=100, count_text=words)
    assert ei.value.status == 400
    assert ei.value.param == param


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","prompt":"x","stream":true}',
        b' \n{ "model" : "m", "prompt": "x {", "stream": true }',
        b'{"model":"m","prompt":"x","stream":true,"stream_options":null}',
        b'{"model":"m","prompt":"x","stream":true,"stream_options":{}}',
        b'{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":false}}',
    ],
)
def test_a_stream_asks_for_usage_keeping_the_clients_bytes_where_it_can(raw: bytes) -> None:
    p = parse_request(raw, "completions", max_tokens_limit=100, count_text=words)
    sent = p.upstream_body()
    assert orjson.loads(sent) == p.body
    assert p.body["stream_options"]["include_usage"] is True
    if b"stream_options" not in raw:  # spliced in front of the client's own members
        at = raw.index(b"{") + 1
        assert sent == raw[:at] + b'"stream_options":{"include_usage":true},' + raw[at:]
    else:  # one member must change: the body is written anew (no duplicate names)
        assert sent.count(b"stream_options") == 1
