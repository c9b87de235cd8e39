"""A request's prefix identity: the chained hashes of its prompt's leading blocks.

What an engine's prefix cache reuses is the *start* of what it is given: the chat's
messages rendered in order through its template, or the completions prompt.  The gateway
does not render templates nor (on its hot path) tokenize, so it hashes a stand-in with the
same sharing: :func:`prompt_head` lays the messages out in order (role, then the text of
the content, with separators no text contains), or takes the prompt's text, or its token
ids as 4 bytes each.  Two requests share their first ``k`` blocks of that layout exactly
when they share the first ``k`` blocks' worth of messages, so equal leading hashes mean a
shared prefix the engine can reuse, and unequal ones mean it cannot (up to the engine's
template adding the same bytes to both).

Blocks are counted in tokens through the fast estimate: ``block_tokens × chars_per_token``
bytes a block (4 characters a token, OpenAI's rule of thumb; ``approx:C`` tokenizers give
their own ``C``), and token ids take 4 bytes each, so a block of ids is ``block_tokens``
ids whichever estimate is configured.  A block's bytes are a *stand-in* for its tokens: a
block boundary need not fall between the same tokens an exact tokenizer would give, which
does not matter for identity.  Only the first ``max_blocks`` blocks are laid out and
hashed, so the cost is bounded whatever the prompt's size.  Pure; no I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from velvetrope.core.prefix_routing import chain_hashes

__all__ = ["CHARS_PER_TOKEN", "prefix_hashes", "prompt_head"]

CHARS_PER_TOKEN = 4
"""Bytes of text a token stands for in a block (the fast estimate's)."""

_ROLE_END = b"\x1f"
_MESSAGE_END = b"\x1e"


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def prompt_head(body: Mapping[str, Any], limit: int) -> bytes:
    """The first ``limit`` bytes (at most) of ``body``'s prompt laid out for hashing (see
    the module docstring): ``messages`` if present, else the first ``prompt``."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = bytearray()
        for m in messages:
            if not isinstance(m, dict):
                continue
            out += str(m.get("role", "")).encode("utf-8", "replace") + _ROLE_END
            out += _content_text(m.get("content")).encode("utf-8", "replace") + _MESSAGE_END
            if len(out) >= limit:
                break
        return bytes(out[:limit])
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch: the first prompt's identity
    if isinstance(prompt, str):
        return prompt[:limit].encode("utf-8", "replace")[:limit]
    if isinstance(prompt, list):
        ids: Sequence[int] = prompt[: limit // 4]
        return array("I", [i & 0xFFFFFFFF for i in ids if isinstance(i, int)]).tobytes()
    return b""


def prefix_hashes(
    body: Mapping[str, Any], block_tokens: int, max_blocks: int, chars_per_token: float = 4
) -> tuple[int, ...]:
    """The chained hashes of ``body``'s first ``max_blocks`` prompt blocks of
    ``block_tokens`` tokens (``chars_per_token`` bytes of text each; 4 bytes a token id)."""
    prompt = body.get("prompt")
    ids = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)
    block_bytes = block_tokens * 4 if ids else max(1, round(block_tokens * chars_per_token))
    return chain_hashes(prompt_head(body, block_bytes * max_blocks), block_bytes, max_blocks)
