"""Calibration against engines other than our own: what it reads of an endpoint.

llama.cpp's server lists a slot's context as ``meta.n_ctx`` in ``/v1/models`` (vLLM says
``max_model_len``), says its slots in ``/props``, and ends every stream with a chunk whose
text is empty.  The sweep must fit that context, send no more streams at once than the
slots, and count no empty chunk as a token (a stream with one chunk more than its tokens
is not "one chunk per token", and every batch measurement would be dropped).  The whole
command against a real llama.cpp is in ``tests/engines/``.
"""

from __future__ import annotations

import pytest

from velvetrope.engine.calibrate import make_plan
from velvetrope.engine.calibrate.client import CalibrationSettings, _endpoint_limits, _pick_model
from velvetrope.engine.profile import load_profile
from velvetrope.errors import PolicyError
from velvetrope.openai.sse import content_choices

H100 = load_profile("llama3-8b-h100")

LLAMA_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "tiny-llama",
            "object": "model",
            "owned_by": "llamacpp",
            "meta": {"n_ctx": 1024, "n_ctx_train": 4096, "n_vocab": 1659},
        }
    ],
}


def test_the_context_comes_from_vllm_or_llama_cpp_model_lists() -> None:
    assert _pick_model(LLAMA_MODELS, None, "u") == ("tiny-llama", 1024)
    vllm = {"data": [{"id": "m", "max_model_len": 8192}]}
    assert _pick_model(vllm, None, "u") == ("m", 8192)
    assert _pick_model({"data": [{"id": "m"}]}, None, "u") == ("m", None)


def test_only_chunks_with_text_are_tokens() -> None:
    """What the sweep counts as a token (:func:`~velvetrope.openai.sse.content_choices`)."""

    def tokens(*choices: object) -> int:
        return content_choices({"choices": list(choices)})

    assert tokens({"index": 0, "text": "a"}) == 1
    assert tokens({"index": 0, "delta": {"content": "a"}}) == 1
    assert tokens({"text": ""}, {"text": "b"}) == 1  # another choice's token
    # llama.cpp's last chunk: an empty text and the finish reason; a role; no choices
    assert tokens({"index": 0, "text": "", "finish_reason": "length"}) == 0
    assert tokens({"index": 0, "delta": {"role": "assistant"}}) == 0
    assert tokens({"index": 0, "delta": {"content": None}}) == 0
    assert tokens() == 0
    assert content_choices({"choices": [], "usage": {"completion_tokens": 3}}) == 0


def test_the_endpoints_limits_shape_the_sweep_and_are_noted() -> None:
    notes: list[str] = []
    limits = _endpoint_limits(H100, 1024, 4, notes)
    assert (limits.max_num_seqs, limits.max_model_len) == (4, 1024)
    assert notes == [
        f"the endpoint's own limits replace the base profile's: max_num_seqs 4 (was "
        f"{H100.max_num_seqs}), max_model_len 1024 (was {H100.max_model_len})"
    ]
    plan = make_plan(limits, quick=True, repeats=1, max_model_len=1024)
    assert max(p.prompt_tokens + p.output_tokens for p in plan) <= 1024 - 64
    batches = [p for p in plan if p.kind == "batch"]
    assert batches and max(p.streams for p in batches) == 4  # never more than the slots
    # larger than the base profile's, or unknown: the base profile's stay, nothing noted
    assert _endpoint_limits(H100, None, None, notes) is H100
    assert _endpoint_limits(H100, 10**6, 10**4, notes) is H100
    assert len(notes) == 1


def test_given_limits_are_validated() -> None:
    with pytest.raises(PolicyError, match="max_model_len"):
        CalibrationSettings(url="http://127.0.0.1:1", max_model_len=0)
    with pytest.raises(PolicyError, match="slots"):
        CalibrationSettings(url="http://127.0.0.1:1", slots=0)
