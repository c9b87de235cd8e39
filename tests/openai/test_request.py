"""The OpenAI request validation both servers share (unit level; HTTP cases live with each
server's tests)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from velvetrope.core import Usage
from velvetrope.errors import RequestError
from velvetrope.gateway.api.parse import expected_tokens, parse_request
from velvetrope.openai.errors import error_json, error_type_for
from velvetrope.openai.request import (
    MAX_JSON_DEPTH,
    Kind,
    count_prompt_tokens,
    parse,
    template_fingerprint,
)
from velvetrope.openai.sse import (
    content_choices,
    data_of,
    split_complete,
    split_events,
    usage_of,
)

MSGS = [{"role": "user", "content": "hi"}]


def words(text: str) -> int:
    return len(text.split())


def _raw(body: Any) -> bytes:
    return body if isinstance(body, bytes) else orjson.dumps(body)


# (body, kind, code, param): one mistake each, the same answer from either server
MISTAKES: list[tuple[Any, Kind, str, str | None]] = [
    (b"{nope", "chat", "invalid_json", None),
    (b"[1, 2]", "chat", "invalid_type", None),
    ({"messages": MSGS}, "chat", "missing_required_parameter", "model"),
    ({"model": 5, "messages": MSGS}, "chat", "invalid_type", "model"),
    ({"model": "", "messages": MSGS}, "chat", "invalid_value", "model"),
    ({"model": "m"}, "chat", "missing_required_parameter", "messages"),
    ({"model": "m", "messages": "hi"}, "chat", "invalid_type", "messages"),
    ({"model": "m", "messages": []}, "chat", "invalid_value", "messages"),
    ({"model": "m", "messages": ["hi"]}, "chat", "invalid_type", "messages[0]"),
    ({"model": "m", "messages": [{"content": "x"}]}, "chat", "missing_required_parameter",
     "messages[0].role"),
    ({"model": "m", "messages": [{"role": "bot", "content": "x"}]}, "chat", "invalid_value",
     "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user"}]}, "chat", "missing_required_parameter",
     "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "chat", "invalid_type",
     "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": ["x"]}]}, "chat", "invalid_type",
     "messages[0].content[0]"),
    ({"model": "m", "messages": MSGS, "stream": "yes"}, "chat", "invalid_type", "stream"),
    ({"model": "m", "messages": MSGS, "stream_options": 3}, "chat", "invalid_type",
     "stream_options"),
    ({"model": "m", "messages": MSGS, "stream_options": {"include_usage": True}}, "chat",
     "invalid_value", "stream_options"),
    ({"model": "m", "messages": MSGS, "stream": True, "stream_options": {"include_usage": 1}},
     "chat", "invalid_type", "stream_options.include_usage"),
    ({"model": "m", "messages": MSGS, "max_tokens": "5"}, "chat", "invalid_type", "max_tokens"),
    ({"model": "m", "messages": MSGS, "max_tokens": True}, "chat", "invalid_type", "max_tokens"),
    ({"model": "m", "messages": MSGS, "max_tokens": 0}, "chat", "invalid_value", "max_tokens"),
    ({"model": "m", "messages": MSGS, "max_completion_tokens": -1}, "chat", "invalid_value",
     "max_completion_tokens"),
    ({"model": "m", "messages": MSGS, "n": 0}, "chat", "invalid_value", "n"),
    ({"model": "m", "messages": MSGS, "n": 17}, "chat", "invalid_value", "n"),
    ({"model": "m", "messages": MSGS, "priority": "high"}, "chat", "invalid_type", "priority"),
    ({"model": "m", "messages": MSGS, "ignore_eos": 1}, "chat", "invalid_type", "ignore_eos"),
    ({"model": "m"}, "completions", "missing_required_parameter", "prompt"),
    ({"model": "m", "prompt": 5}, "completions", "invalid_type", "prompt"),
    ({"model": "m", "prompt": []}, "completions", "invalid_value", "prompt"),
    ({"model": "m", "prompt": [1, -2]}, "completions", "invalid_type", "prompt"),
    ({"model": "m", "prompt": ["a", 3]}, "completions", "invalid_type", "prompt"),
    # issue 32: a field of the wrong type anywhere is a 400 naming it, never a 500
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
     "chat", "missing_required_parameter", "messages[0].content[0].text"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "chat", "invalid_type", "messages[0].content[0].text"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "chat", "missing_required_parameter", "messages[0].content[0].text"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": 3, "text": "x"}]}]},
     "chat", "invalid_type", "messages[0].content[0].type"),
    ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": 5}]}]},
     "chat", "invalid_type", "messages[0].content[0].image_url"),
    ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": None}}]}]},
     "chat", "missing_required_parameter", "messages[0].content[0].image_url.url"),
    ({"model": "m", "messages": [*MSGS, {"role": "user", "content": "x", "name": 5}]},
     "chat", "invalid_type", "messages[1].name"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": "x"}]},
     "chat", "invalid_type", "messages[0].tool_calls"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [5]}]},
     "chat", "invalid_type", "messages[0].tool_calls[0]"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": 5, "arguments": "{}"}}]}]},
     "chat", "invalid_type", "messages[0].tool_calls[0].function.name"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]},
     "chat", "invalid_type", "messages[0].tool_calls[0].function.arguments"),
    ({"model": "m", "messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]},
     "chat", "invalid_type", "messages[0].tool_call_id"),
    ({"model": "m", "messages": MSGS, "tools": {}}, "chat", "invalid_type", "tools"),
    ({"model": "m", "messages": MSGS, "tools": [None]}, "chat", "invalid_type", "tools[0]"),
    ({"model": "m", "messages": MSGS, "tools": [{"type": "function"}]},
     "chat", "missing_required_parameter", "tools[0].function"),
    ({"model": "m", "messages": MSGS, "tools": [{"type": "function", "function": {}}]},
     "chat", "missing_required_parameter", "tools[0].function.name"),
    ({"model": "m", "messages": MSGS, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": []}}]},
     "chat", "invalid_type", "tools[0].function.parameters"),
    ({"model": "m", "messages": MSGS, "tool_choice": 1}, "chat", "invalid_type", "tool_choice"),
    ({"model": "m", "messages": MSGS, "tool_choice": {"type": "function", "function": {
        "name": None}}}, "chat", "missing_required_parameter", "tool_choice.function.name"),
    ({"model": "m", "messages": MSGS, "stop": 5}, "chat", "invalid_type", "stop"),
    ({"model": "m", "prompt": "x", "stop": ["a", None]}, "completions", "invalid_type",
     "stop[1]"),
    ({"model": "m", "messages": MSGS, "logit_bias": [1]}, "chat", "invalid_type", "logit_bias"),
    ({"model": "m", "messages": MSGS, "logit_bias": {"50256": "-100"}}, "chat", "invalid_type",
     "logit_bias.50256"),
    ({"model": "m", "messages": MSGS, "stream": True, "stream_options": {
        "continuous_usage_stats": "yes"}}, "chat", "invalid_type",
     "stream_options.continuous_usage_stats"),
    ({"model": "m", "messages": MSGS, "temperature": "hot"}, "chat", "invalid_type",
     "temperature"),
    ({"model": "m", "messages": MSGS, "top_p": True}, "chat", "invalid_type", "top_p"),
    ({"model": "m", "messages": MSGS, "seed": 1.5}, "chat", "invalid_type", "seed"),
    ({"model": "m", "messages": MSGS, "user": ["u"]}, "chat", "invalid_type", "user"),
    ({"model": "m", "messages": MSGS, "response_format": "json"}, "chat", "invalid_type",
     "response_format"),
    ({"model": "m", "messages": MSGS, "response_format": {"type": None}}, "chat",
     "missing_required_parameter", "response_format.type"),
    ({"model": "m", "messages": MSGS, "parallel_tool_calls": "no"}, "chat", "invalid_type",
     "parallel_tool_calls"),
    ({"model": "m", "prompt": "x", "echo": 1}, "completions", "invalid_type", "echo"),
    ({"model": "m", "prompt": "x", "suffix": 1}, "completions", "invalid_type", "suffix"),
    ({"model": "m", "prompt": "x", "stop_token_ids": [1, "2"]}, "completions", "invalid_type",
     "stop_token_ids[1]"),
    ({"model": "m", "prompt": "x", "min_tokens": -1}, "completions", "invalid_value",
     "min_tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "kind", "code", "param"), MISTAKES)
def test_a_mistake_gets_the_same_answer_from_both_servers(
    body: Any, kind: Kind, code: str, param: str | None
) -> None:
    raw = _raw(body)
    with pytest.raises(RequestError) as engine_side:
        parse(raw, kind)  # what velvetrope engine runs
    with pytest.raises(RequestError) as gateway_side:
        parse_request(raw, kind, max_tokens_limit=100, count_text=words)
    e, g = engine_side.value, gateway_side.value
    assert (e.status, e.code, e.param) == (400, code, param)
    assert (g.status, g.code, g.param, g.message) == (e.status, e.code, e.param, e.message)
    err = orjson.loads(error_json(e))["error"]
    assert err == {"message": e.message, "type": "invalid_request_error", "code": code,
                   "param": param}  # fmt: skip


def test_unknown_keys_pass_unless_strict_and_the_gateway_adds_its_max_tokens_limit() -> None:
    bogus = _raw({"model": "m", "prompt": "x", "bogus": 1})
    assert parse(bogus, "completions").model == "m"  # the engine ignores what it does not use
    # the gateway passes it on untouched, byte for byte, unless in strict mode
    passed = parse_request(bogus, "completions", max_tokens_limit=100, count_text=words)
    assert passed.upstream_body() == bogus
    with pytest.raises(RequestError) as ei:
        parse_request(
            bogus, "completions", max_tokens_limit=100, count_text=words, known_keys_only=True
        )
    assert (ei.value.code, ei.value.param) == ("unknown_parameter", "bogus")
    big = _raw({"model": "m", "prompt": "x", "max_tokens": 101})
    assert parse(big, "completions").max_tokens == 101
    with pytest.raises(RequestError) as ei:
        parse_request(big, "completions", max_tokens_limit=100, count_text=words)
    assert (ei.value.code, ei.value.param) == ("invalid_value", "max_tokens")
    assert "maximum of 100" in ei.value.message


def test_fields_both_servers_act_on() -> None:
    req = parse(
        _raw(
            {
                "model": "m",
                "messages": [{"role": "assistant", "tool_calls": []}, *MSGS],
                "max_tokens": 50,
                "max_completion_tokens": 70,
                "n": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
                "priority": -3,
                "ignore_eos": True,
            }
        ),
        "chat",
    )
    assert (req.model, req.stream, req.include_usage, req.n) == ("m", True, True, 4)
    assert req.max_tokens == 70  # max_completion_tokens wins, as in OpenAI's API and vLLM
    assert (req.priority, req.ignore_eos, len(req.messages)) == (-3, True, 2)
    plain = parse(b'{"model": "m", "prompt": "a b"}', "completions")
    assert (plain.max_tokens, plain.n, plain.priority, plain.prompts) == (None, 1, None, ("a b",))


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [("a b c", 3), ("", 1), ([7, 8], 2), (["a b", "c"], 3), ([[1, 2, 3], [4]], 4)],
)
def test_completions_prompts_count_text_or_ids_summed_over_a_batch(
    prompt: Any, tokens: int
) -> None:
    req = parse(_raw({"model": "m", "prompt": prompt}), "completions")
    assert count_prompt_tokens(req, words) == tokens


def test_a_chat_is_counted_with_openais_convention_unless_given_a_counter() -> None:
    req = parse(_raw({"model": "m", "messages": [{"role": "user", "content": "a b"}]}), "chat")
    assert count_prompt_tokens(req, words) == 3 + (3 + 1 + 2)
    assert count_prompt_tokens(req, words, lambda messages: 42) == 42


def test_error_types_follow_the_status_unless_named() -> None:
    assert error_type_for(429) == "rate_limit_error"
    assert error_type_for(500) == "server_error"
    assert error_type_for(418) == "api_error"
    exc = RequestError("nope", status=404, code="not_found")
    assert orjson.loads(error_json(exc))["error"]["type"] == "not_found_error"
    named = RequestError("nope", status=400, error_type="custom")
    assert orjson.loads(error_json(named))["error"]["type"] == "custom"


@pytest.mark.parametrize(
    ("buf", "done", "rest"),
    [
        (b"", b"", b""),
        (b"data: 1\n", b"", b"data: 1\n"),
        (b"data: 1\n\n", b"data: 1\n\n", b""),
        (b"data: 1\n\ndata: 2\n\ndata: 3", b"data: 1\n\ndata: 2\n\n", b"data: 3"),
        (b"data: 1\n\n\n", b"data: 1\n\n\n", b""),  # a blank line more: an empty event
        (b"data: 1\n\n\ndata", b"data: 1\n\n\n", b"data"),
        (b": ping\n\n\n\ndata: 2\n", b": ping\n\n\n\n", b"data: 2\n"),
    ],
)
def test_sse_complete_events_end_at_the_last_blank_line(
    buf: bytes, done: bytes, rest: bytes
) -> None:
    assert split_complete(buf) == (done, rest)
    events, after = split_events(buf)
    assert b"".join(events) == done and after == rest
    assert all(e.endswith(b"\n\n") for e in events)


def test_sse_events_one_by_one() -> None:
    assert split_events(b"a\n\n\nb\n\n\n") == ([b"a\n\n", b"\nb\n\n\n"], b"")
    assert split_events(b"a\n\n\n\nb\n\n") == ([b"a\n\n", b"\n\n", b"b\n\n"], b"")


def test_sse_reading() -> None:
    events, rest = split_events(b"data: {}\n\n: ping\n\ndata: [DO")
    assert events == [b"data: {}\n\n", b": ping\n\n"]
    assert rest == b"data: [DO"
    assert data_of(b"data: [DONE]\n") == b"[DONE]"
    assert data_of(b": ping") is None
    chunk = {"choices": [{"delta": {"content": "a"}}, {"text": "b"}, {"text": ""}]}
    assert content_choices(chunk) == 2
    assert usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}) == (3, 4, 0)
    assert usage_of({"usage": None}) is None


@pytest.mark.parametrize(
    "obj",
    [
        None,
        "usage",
        ["usage"],
        {},
        {"usage": []},
        {"usage": "prompt_tokens"},
        {"usage": {"prompt_tokens": 3}},
        {"usage": {"prompt_tokens": 3, "completion_tokens": "4"}},
        {"usage": {"prompt_tokens": 3.0, "completion_tokens": 4}},
        {"usage": {"prompt_tokens": None, "completion_tokens": 4}},
    ],
)
def test_usage_of_anything_without_two_integer_counts_is_none(obj: object) -> None:
    assert usage_of(obj) is None


def test_usage_of_is_a_usage() -> None:
    u = usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
    assert type(u) is Usage and u == Usage(3, 4) and u.total == 7


def test_a_template_fingerprint_is_the_system_prompt_or_the_first_prefix() -> None:
    def fp(body: dict[str, Any], kind: Kind = "chat") -> str:
        return template_fingerprint(parse(orjson.dumps({"model": "m", **body}), kind))

    sys_a = {"role": "system", "content": "You classify tickets."}
    a1 = fp({"messages": [sys_a, {"role": "user", "content": "printer broken"}]})
    a2 = fp({"messages": [sys_a, {"role": "user", "content": "refund please, long text"}]})
    b = fp({"messages": [{"role": "system", "content": "You write essays."}, sys_a]})
    assert a1 == a2 != b
    assert len(a1) == 16
    # parts count as their text
    parts = {"role": "system", "content": [{"type": "text", "text": "You classify tickets."}]}
    assert fp({"messages": [parts, {"role": "user", "content": "x"}]}) == a1
    # no system prompt: the first message's first 512 characters
    head = "Translate to French: " + "x" * 600
    u1 = fp({"messages": [{"role": "user", "content": head + "one"}]})
    u2 = fp({"messages": [{"role": "user", "content": head + "two"}]})
    u3 = fp({"messages": [{"role": "user", "content": "Summarise: " + "x" * 600}]})
    assert u1 == u2 != u3
    c1 = fp({"prompt": "def f(): " + "y" * 600 + "a"}, "completions")
    c2 = fp({"prompt": "def f(): " + "y" * 600 + "b"}, "completions")
    assert c1 == c2
    assert fp({"prompt": [1, 2, 3]}, "completions") != c1


def test_the_gateway_parses_the_template_and_the_expected_length() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "system", "content": "S"}]})
    parsed = parse_request(raw, "chat", max_tokens_limit=100, count_text=len)
    assert parsed.template == template_fingerprint(parse(raw, "chat"))
    assert expected_tokens(b"120") == 120
    assert expected_tokens(b" 7 ") == 7
    for bad in (None, b"", b"0", b"-3", b"1e3", b"many"):
        assert expected_tokens(bad) is None


def _nested(levels: int) -> bytes:
    """JSON text of a value ``levels`` levels deep (objects and arrays by turns), written
    out by hand: orjson writes no more than 254 levels."""
    opens = "".join("[" if i % 2 else '{"k":' for i in range(levels))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(levels)))
    return (opens + '"x"' + closes).encode()


@pytest.mark.parametrize("where", ["messages", "tools", "extra"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 300, 1100])
def test_json_nested_past_the_limit_is_a_400_from_both_servers(where: str, depth: int) -> None:
    # the body is level 1; a message's members are at level 3, a tool's parameters at 4
    deep = {"role": "user", "content": "x", "extra": "@"}
    tool = {"type": "function", "function": {"name": "f", "parameters": "@"}}
    body: dict[str, Any] = {"model": "m", "messages": [*MSGS, deep], "tools": [tool], "x": "@"}
    levels = {"messages": depth - 3, "tools": depth - 4, "extra": depth - 1}[where]
    first, *rest = orjson.dumps(body).split(b'"@"')  # in the order messages, tools, extra
    raw = first
    for place, after in zip(("messages", "tools", "extra"), rest, strict=True):
        raw += (_nested(levels) if place == where else b"{}") + after
    if depth <= MAX_JSON_DEPTH:  # at the limit: served, and written again for the upstream
        assert parse(raw, "chat").model == "m"
        parse_request(raw, "chat", max_tokens_limit=100, count_text=words).upstream_body()
        return
    with pytest.raises(RequestError) as engine_side:
        parse(raw, "chat")
    with pytest.raises(RequestError) as gateway_side:
        parse_request(raw, "chat", max_tokens_limit=100, count_text=words)
    e, g = engine_side.value, gateway_side.value
    assert (e.status, e.code, e.param, e.message) == (g.status, g.code, g.param, g.message)
    assert (e.status, e.code) == (400, "invalid_value")
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in e.message


def test_only_text_parts_make_a_fingerprint_whatever_else_a_part_carries() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}, "text": 5}
    text = {"type": "text", "text": "Describe"}
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": [image, text]}]})
    alone = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": [text]}]})
    parsed = parse_request(raw, "chat", max_tokens_limit=100, count_text=words)
    assert parsed.template == template_fingerprint(parse(alone, "chat"))
