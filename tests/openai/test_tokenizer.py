"""The tokenizer seam: exact BPE counts, OpenAI's chat convention, the approximation, specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from velvetrope.errors import ConfigError
from velvetrope.openai.tokenizer import (
    ApproxTokenizer,
    BpeTokenizer,
    HFTokenizer,
    Tokenizer,
    count_chat_with,
    get_tokenizer,
)


@pytest.mark.parametrize(
    ("spec", "text", "expected"),
    [
        ("cl100k_base", "hello world", 2),
        ("cl100k_base", "", 0),
        ("cl100k_base", "Hello, world!", 4),
        ("cl100k_base", "tiktoken is great!", 6),
        ("o200k_base", "hello world", 2),
        ("o200k_base", "", 0),
    ],
)
def test_bpe_known_counts(spec: str, text: str, expected: int) -> None:
    assert get_tokenizer(spec).count(text) == expected


def test_special_token_text_is_counted_as_plain_text() -> None:
    # OpenAI's API treats "<|endoftext|>" in user content as text, not as a control token.
    assert get_tokenizer("cl100k_base").count("<|endoftext|>") == 7


def test_chat_follows_openais_per_message_convention() -> None:
    tok = get_tokenizer("cl100k_base")
    # What OpenAI's API reports as prompt_tokens for this chat on cl100k models.
    assert tok.count_chat([{"role": "user", "content": "Hello"}]) == 8
    two = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello world", "name": "bob"},
    ]
    expected = 3 + (3 + 1 + tok.count("You are terse.")) + (3 + 1 + 2 + (1 + 1)) + 0
    assert tok.count_chat(two) == expected


def test_chat_content_parts_count_like_the_plain_string() -> None:
    tok = get_tokenizer("cl100k_base")
    plain = [{"role": "user", "content": "hello world"}]
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hello world"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
            ],
        }
    ]
    assert tok.count_chat(parts) == tok.count_chat(plain)


def test_chat_counts_other_fields_as_json_and_skips_none() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return 1

    total = count_chat_with(count, [{"role": "assistant", "content": None, "tool_calls": calls}])
    assert total == 3 + 3 + 1 + 1
    assert seen[0] == "assistant"
    assert seen[1].startswith('[{"id":"c1"')


def test_long_text_is_counted_in_pieces_close_to_exact() -> None:
    tok = get_tokenizer("cl100k_base")
    text = "The quick brown fox jumps over the lazy dog. " * 5000  # 225,000 characters
    assert tok.count(text) == pytest.approx(10 * 5000, abs=5)


def test_approx_is_never_zero_for_non_empty_text() -> None:
    tok = get_tokenizer("approx")
    assert tok.count("") == 0
    for text in ["a", " ", "ab", "abcd", "abcde", "\n", "日本"]:
        assert tok.count(text) >= 1
    assert tok.count("a" * 400) == 100
    assert tok.count("a" * 401) == 101


def test_approx_with_custom_ratio() -> None:
    tok = get_tokenizer("approx:2")
    assert isinstance(tok, ApproxTokenizer)
    assert tok.chars_per_token == 2.0
    assert tok.count("abcde") == 3
    assert tok.name == "approx:2"


def test_implementations_satisfy_the_protocol() -> None:
    for spec in ["cl100k_base", "o200k_base", "approx"]:
        tok = get_tokenizer(spec)
        assert isinstance(tok, Tokenizer)
        assert tok.name == spec


def test_get_tokenizer_caches_instances() -> None:
    assert get_tokenizer("cl100k_base") is get_tokenizer("cl100k_base")
    assert isinstance(get_tokenizer("cl100k_base"), BpeTokenizer)


@pytest.mark.parametrize(
    "spec", ["", "gpt2", "cl100k", "tiktoken:cl100k_base", "approx:zero", "approx:0", "hf:"]
)
def test_unknown_or_malformed_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError):
        get_tokenizer(spec)


def test_bpe_rejects_an_unknown_encoding() -> None:
    with pytest.raises(ConfigError, match="p50k_base"):
        BpeTokenizer("p50k_base")


def test_hf_tokenizer_missing_file_or_package_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(ConfigError, match="tokenizer"):
        get_tokenizer(f"hf:{missing}")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError):
        HFTokenizer(bad)


def test_hf_tokenizer_counts_with_a_real_tokenizer_json(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    hf = get_tokenizer(f"hf:{path}")
    assert hf.count("hello world hello") == 3
    assert hf.count("") == 0
    assert hf.count_chat([{"role": "user", "content": "hello"}]) == 3 + 1 + 1 + 3
