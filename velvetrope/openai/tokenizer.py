"""The tokenizer seam: how many tokens a prompt or a chat costs.

Three implementations sit behind one :class:`Tokenizer` protocol, chosen by a spec string
(:func:`get_tokenizer`):

``cl100k_base``, ``o200k_base``
    OpenAI's BPE encodings through the ``bpe-openai`` package (:class:`BpeTokenizer`), which
    ships its vocabularies, so nothing is downloaded.  Exact.  Special-token strings such
    as ``<|endoftext|>`` in the text are counted as ordinary text, as OpenAI's API does
    for user content.  Counting a 2,000-token prompt costs about 0.2 ms.
``hf:/path/to/tokenizer.json``
    A model's own HuggingFace ``tokenizer.json`` through the ``tokenizers`` package
    (:class:`HFTokenizer`, imported lazily; not a hard dependency).  Exact for plain text;
    no special tokens (BOS) are added.
``approx`` (or ``approx:CHARS_PER_TOKEN``)
    :class:`ApproxTokenizer`: ``ceil(len(text) / chars_per_token)`` with 4 characters per
    token by default (OpenAI's rule of thumb for English).  Costs nothing; never 0 for
    non-empty text; overestimates code and whitespace-heavy text a little and
    underestimates CJK text (about one token per character) by up to 4x.

Chats are counted with OpenAI's documented convention (the "How to count tokens with
tiktoken" cookbook, for gpt-3.5-turbo-0613 and later): every message costs
:data:`TOKENS_PER_MESSAGE` (3) plus the tokens of its values (role, content, name, ...),
a ``name`` costs :data:`TOKENS_PER_NAME` (1) more, and every reply is primed with
:data:`REPLY_PRIMING_TOKENS` (3).  ``[{"role": "user", "content": "Hello"}]`` is 8 tokens
with ``cl100k_base``, as OpenAI's API reports.  Content given as a list of parts counts its
``text`` parts only (images and audio are not priced); other fields (``tool_calls``,
``tool_call_id``...) are counted as their compact JSON text.  The same convention is used
for every tokenizer: a model's own chat template may differ by a few tokens per message.

Errors: an unknown spec, a missing package or a missing/invalid file raise
:class:`~velvetrope.errors.ConfigError`.  Tokenizers are immutable and safe to share;
:func:`get_tokenizer` returns one cached instance per spec.
"""

from __future__ import annotations

import functools
import importlib
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from velvetrope.errors import ConfigError

__all__ = [
    "BPE_ENCODINGS",
    "REPLY_PRIMING_TOKENS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "ApproxTokenizer",
    "BpeTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "count_chat_with",
    "get_tokenizer",
]

TOKENS_PER_MESSAGE = 3
"""Tokens every chat message costs besides its values (``<|start|>role ... <|end|>``)."""
TOKENS_PER_NAME = 1
"""Extra tokens a message's ``name`` field costs."""
REPLY_PRIMING_TOKENS = 3
"""Tokens that prime the assistant's reply (``<|start|>assistant<|message|>``)."""

BPE_ENCODINGS = ("cl100k_base", "o200k_base")
"""The OpenAI encodings :class:`BpeTokenizer` accepts."""

# bpe-openai refuses texts of 1,000,000 characters or more and results above 200,000
# tokens; longer texts are counted in pieces of at most this many characters.
_PIECE_CHARS = 100_000
_SHORT_CHARS = 24
_SHORT_ENTRIES = 4096


@runtime_checkable
class Tokenizer(Protocol):
    """Counts tokens.  Implementations are immutable and thread-safe."""

    @property
    def name(self) -> str:
        """The spec this tokenizer answers to (``cl100k_base``, ``approx``, ``hf:...``)."""
        ...

    def count(self, text: str) -> int:
        """Tokens in ``text``: ``0`` for ``""``, at least 1 for any other text."""
        ...

    def count_chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Prompt tokens of a chat, with OpenAI's per-message overhead (module docstring).

        ``messages`` are OpenAI chat messages (mappings with ``role`` and ``content``);
        the caller has validated their shape.
        """
        ...


def count_chat_with(count: Callable[[str], int], messages: Sequence[Mapping[str, Any]]) -> int:
    """OpenAI's chat convention on top of any text counter ``count``.

    ``3`` per message, plus the tokens of each value (``content`` as a string, or the
    ``text`` of its parts; ``name`` + 1; ``role``; any other field as compact JSON),
    plus ``3`` for the reply.  ``None`` values cost nothing.
    """
    total = REPLY_PRIMING_TOKENS
    for message in messages:
        total += TOKENS_PER_MESSAGE
        for key, value in message.items():
            if value is None:
                continue
            if isinstance(value, str):
                total += count(value)
                if key == "name":
                    total += TOKENS_PER_NAME
            elif key == "content" and isinstance(value, list):
                for part in value:
                    if isinstance(part, Mapping):
                        text = part.get("text")
                        if isinstance(text, str):
                            total += count(text)
            else:
                total += count(orjson.dumps(value).decode())
    return total


def _pieces(text: str) -> list[str]:
    """Split a very long text into pieces of at most ``_PIECE_CHARS``, before whitespace."""
    out: list[str] = []
    start = 0
    n = len(text)
    while n - start > _PIECE_CHARS:
        end = start + _PIECE_CHARS
        cut = max(text.rfind(" ", start + 1, end), text.rfind("\n", start + 1, end))
        if cut <= start:
            cut = end
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


@functools.cache
def _load_bpe(encoding: str) -> Any:
    """Build (once per process) the bpe-openai encoding; costs 30-70 ms."""
    try:
        # bpe-openai 0.1.x reads its vocabularies with importlib.resources.open_binary
        # (at import and at load), deprecated since Python 3.11; the warning is theirs.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import bpe_openai

            return bpe_openai.get_encoding(encoding)
    except ModuleNotFoundError:
        raise ConfigError(
            f"tokenizer {encoding!r}: the 'bpe-openai' package is not installed: "
            "install 'velvetrope[tokenizers]' (or use tokenizer: approx)"
        ) from None
    except (KeyError, ValueError, RuntimeError) as exc:  # UnsupportedModelError is a KeyError
        raise ConfigError(f"tokenizer {encoding!r}: bpe-openai cannot load it: {exc}") from None


class BpeTokenizer:
    """Exact counts with an OpenAI encoding (``cl100k_base`` by default, or ``o200k_base``).

    The encoding is built once per process and shared.  Texts up to 100,000 characters are
    counted exactly; longer ones are counted in pieces split before whitespace, which can
    differ from the exact count by a token or so per piece.
    """

    __slots__ = ("_encode", "_name", "_short")

    def __init__(self, encoding: str = "cl100k_base") -> None:
        if encoding not in BPE_ENCODINGS:
            raise ConfigError(
                f"tokenizer {encoding!r}: unknown OpenAI encoding; "
                f"expected one of {', '.join(BPE_ENCODINGS)}"
            )
        self._name = encoding
        self._encode: Callable[[str], list[int]] = _load_bpe(encoding).encode_ordinary
        # Counts of short strings (roles, names, one-word messages): a call into
        # bpe-openai costs ~5 us of Python overhead, a dict hit ~50 ns.
        self._short: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self._name

    def count(self, text: str) -> int:
        if len(text) <= _SHORT_CHARS:
            n = self._short.get(text)
            if n is None:
                n = len(self._encode(text))
                if len(self._short) < _SHORT_ENTRIES:
                    self._short[text] = n
            return n
        if len(text) <= _PIECE_CHARS:
            return len(self._encode(text))
        return sum(len(self._encode(piece)) for piece in _pieces(text))

    def count_chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return count_chat_with(self.count, messages)

    def __repr__(self) -> str:
        return f"BpeTokenizer({self._name!r})"


@functools.cache
def _load_hf(path: str) -> Any:
    """Load (once per process and path) a HuggingFace ``tokenizer.json``."""
    try:
        tokenizers = importlib.import_module("tokenizers")
    except ImportError:
        raise ConfigError(
            f"tokenizer 'hf:{path}': the 'tokenizers' package is not installed: "
            "install 'velvetrope[tokenizers]'"
        ) from None
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"tokenizer 'hf:{path}': file not found")
    try:
        return tokenizers.Tokenizer.from_file(str(file))
    # tokenizers raises a bare `Exception` for files it cannot parse.
    except Exception as exc:
        raise ConfigError(f"tokenizer 'hf:{path}': not a valid tokenizer.json: {exc}") from None


class HFTokenizer:
    """Exact counts with a model's own ``tokenizer.json`` (HF ``tokenizers``, lazy import).

    ``path`` must name an existing file; :class:`~velvetrope.errors.ConfigError` if the
    package is missing or the file is missing or invalid.  No special tokens are added.
    """

    __slots__ = ("_name", "_tok")

    def __init__(self, path: str | Path) -> None:
        self._tok = _load_hf(str(path))
        self._name = f"hf:{path}"

    @property
    def name(self) -> str:
        return self._name

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return count_chat_with(self.count, messages)

    def __repr__(self) -> str:
        return f"HFTokenizer({self._name[3:]!r})"


class ApproxTokenizer:
    """``ceil(len(text) / chars_per_token)``: free, roughly right for English prose.

    ``chars_per_token`` (default 4.0) must be positive and finite.  Never 0 for a non-empty
    text; see the module docstring for where it errs.
    """

    __slots__ = ("_cpt", "_name")

    def __init__(self, chars_per_token: float = 4.0) -> None:
        if not (math.isfinite(chars_per_token) and chars_per_token > 0):
            raise ConfigError(
                f"tokenizer 'approx': chars_per_token must be a positive number, "
                f"got {chars_per_token!r}"
            )
        self._cpt = float(chars_per_token)
        self._name = "approx" if self._cpt == 4.0 else f"approx:{chars_per_token:g}"

    @property
    def name(self) -> str:
        return self._name

    @property
    def chars_per_token(self) -> float:
        """Characters assumed per token."""
        return self._cpt

    def count(self, text: str) -> int:
        return math.ceil(len(text) / self._cpt)

    def count_chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return count_chat_with(self.count, messages)

    def __repr__(self) -> str:
        return f"ApproxTokenizer({self._cpt!r})"


@functools.cache
def get_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer for ``spec`` (cached: one instance per spec and process).

    ``spec`` is ``cl100k_base``, ``o200k_base``, ``approx``, ``approx:CHARS_PER_TOKEN`` or
    ``hf:/path/to/tokenizer.json``.  Anything else, a missing package or file, raises
    :class:`~velvetrope.errors.ConfigError`.
    """
    if spec in BPE_ENCODINGS:
        return BpeTokenizer(spec)
    if spec == "approx":
        return ApproxTokenizer()
    if spec.startswith("approx:"):
        try:
            cpt = float(spec.removeprefix("approx:"))
        except ValueError:
            raise ConfigError(
                f"tokenizer {spec!r}: expected approx:CHARS_PER_TOKEN with a number"
            ) from None
        return ApproxTokenizer(cpt)
    if spec.startswith("hf:"):
        path = spec.removeprefix("hf:")
        if not path:
            raise ConfigError("tokenizer 'hf:': expected hf:/path/to/tokenizer.json")
        return HFTokenizer(path)
    raise ConfigError(
        f"unknown tokenizer {spec!r}: expected one of {', '.join(BPE_ENCODINGS)}, "
        f"approx, approx:CHARS_PER_TOKEN or hf:/path/to/tokenizer.json"
    )
