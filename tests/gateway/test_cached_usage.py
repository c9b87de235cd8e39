"""The cached prompt tokens an engine reports, read on every endpoint that reports them,
whole and streamed: OpenAI's ``usage.prompt_tokens_details.cached_tokens`` (chat and
completions: vLLM with prefix caching and ``--enable-prompt-tokens-details``), the Responses
API's ``usage.input_tokens_details.cached_tokens`` and Anthropic's
``usage.cache_read_input_tokens`` (whose ``input_tokens`` leaves the cache out).  What the
engine does not report is 0 cached: every prompt token is then charged as input."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from velvetrope.core import Usage
from velvetrope.gateway.api.endpoints import ENDPOINTS, read_usage
from velvetrope.gateway.api.messages import MessagesRelay, messages_usage
from velvetrope.gateway.api.responses import ResponsesRelay, responses_usage
from velvetrope.gateway.upstream.relay import UsageTally, relay_events
from velvetrope.openai.sse import DONE, cached_of, json_event, usage_of


def _nothing() -> None:
    pass


def _typed(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\n".encode() + json_event({"type": kind, **fields})


CHAT_USAGE = {
    "prompt_tokens": 1040,
    "completion_tokens": 7,
    "total_tokens": 1047,
    "prompt_tokens_details": {"cached_tokens": 1024},
}


@pytest.mark.parametrize(
    ("details", "cached"),
    [
        ({"cached_tokens": 1024}, 1024),
        ({"cached_tokens": 0}, 0),
        ({"cached_tokens": None}, 0),  # vLLM without prefix caching: null
        (None, 0),  # vLLM without --enable-prompt-tokens-details
        ({}, 0),
        ({"cached_tokens": "12"}, 0),
        ({"cached_tokens": -3}, 0),
        ({"cached_tokens": 5000}, 1040),  # never more than the prompt
        ({"cached_tokens": True}, 0),
    ],
)
def test_chat_and_completions_bodies_carry_prompt_tokens_details_cached_tokens(
    details: object, cached: int
) -> None:
    usage = {**CHAT_USAGE, "prompt_tokens_details": details}
    for obj in (
        {"object": "chat.completion", "choices": [], "usage": usage},
        {"object": "text_completion", "choices": [], "usage": usage},
    ):
        u = usage_of(obj)
        assert u == Usage(1040, 7, cached) and isinstance(u, Usage)
        assert u.cached_tokens == cached
    plain = {k: v for k, v in CHAT_USAGE.items() if k != "prompt_tokens_details"}
    assert usage_of({"usage": plain}) == Usage(1040, 7, 0)


def test_a_streamed_chats_final_usage_chunk_carries_its_cached_tokens() -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": []}
    stream = (
        json_event({**chunk, "choices": [{"index": 0, "delta": {"content": "hi"}}]})
        + json_event({**chunk, "usage": CHAT_USAGE})
        + DONE
    )
    for cut in (len(stream), stream.index(b"data:", 10)):  # whole, or in two pieces
        tally = UsageTally(1000)
        kept = relay_events(stream[:cut], tally, False, _nothing)
        if cut < len(stream):
            kept += relay_events(stream[cut:], tally, False, _nothing)
        assert tally.usage == Usage(1040, 7, 1024)
        assert tally.usage_so_far() == Usage(1040, 7, 1024)
        assert b"usage" not in kept  # the client did not ask for it
    # an engine that reports fewer tokens than were streamed keeps its cached count
    tally = UsageTally(1000)
    tally.usage, tally.completion_tokens = Usage(1040, 2, 1024), 5
    assert tally.usage_so_far() == Usage(1040, 5, 1024)
    assert UsageTally(1000).usage_so_far() == Usage(1000, 0, 0)  # no usage: none cached


def test_responses_usage_reads_input_tokens_details_whole_and_streamed() -> None:
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "usage": {
            "input_tokens": 900,
            "input_tokens_details": {"cached_tokens": 768},
            "output_tokens": 12,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 912,
        },
    }
    assert responses_usage(orjson.dumps(response)) == (Usage(900, 12, 768), "resp_1")
    assert read_usage(ENDPOINTS["/v1/responses"], orjson.dumps(response)) == Usage(900, 12, 768)
    bare = {**response, "usage": {"input_tokens": 900, "output_tokens": 12}}
    assert responses_usage(orjson.dumps(bare))[0] == Usage(900, 12, 0)
    stream = (
        _typed("response.created", response={**response, "status": "in_progress", "usage": None})
        + _typed("response.output_text.delta", delta="hi")
        + _typed("response.completed", response=response)
    )
    relay, tally = ResponsesRelay(), UsageTally(850)
    relay(stream, tally, True, _nothing)
    assert tally.usage == Usage(900, 12, 768) and relay.response_id == "resp_1"


def test_messages_usage_adds_the_caches_tokens_to_the_prompt_and_counts_reads_cached() -> None:
    usage = {
        "input_tokens": 20,  # Anthropic's: the input after the last cache breakpoint only
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 1000,
        "output_tokens": 9,
    }
    body = {"id": "msg_1", "type": "message", "content": [], "usage": usage}
    assert messages_usage(orjson.dumps(body)) == Usage(1120, 9, 1000)
    assert read_usage(ENDPOINTS["/v1/messages"], orjson.dumps(body)) == Usage(1120, 9, 1000)
    plain = {**body, "usage": {"input_tokens": 20, "output_tokens": 9}}
    assert messages_usage(orjson.dumps(plain)) == Usage(20, 9, 0)
    nulls = {**body, "usage": {**usage, "cache_read_input_tokens": None}}
    assert messages_usage(orjson.dumps(nulls)) == Usage(120, 9, 0)
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
    head = _typed("message_start", message={**body, "usage": start_usage})
    text = _typed("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"})
    # message_delta with the output only (the input is message_start's) ...
    relay, tally = MessagesRelay(), UsageTally(1100)
    relay(head + text + _typed("message_delta", usage={"output_tokens": 9}), tally, True, _nothing)
    assert tally.usage == Usage(1120, 9, 1000)
    # ... or with every count again, as Anthropic's API now sends it
    relay, tally = MessagesRelay(), UsageTally(1100)
    relay(head + text + _typed("message_delta", usage=usage), tally, True, _nothing)
    assert tally.usage == Usage(1120, 9, 1000)


def test_cached_of_takes_only_a_count_within_the_prompt() -> None:
    assert cached_of({"cached_tokens": 10}, 100) == 10
    assert cached_of({"cached_tokens": 10}, 4) == 4
    assert cached_of({"cached_tokens": 10}, 0) == 0
    assert cached_of([10], 100) == 0
    assert cached_of(None, 100) == 0
