"""The OpenAI protocol, once, for the gateway and ``velvetrope engine`` alike.

* :mod:`.request`: validating completions and chat-completions bodies
  (:func:`~velvetrope.openai.request.parse`), counting their prompt tokens;
* :mod:`.errors`: error bodies in OpenAI's shape and the request-defect errors;
* :mod:`.sse`: server-sent events, written and read;
* :mod:`.tokenizer`: the :class:`~velvetrope.openai.tokenizer.Tokenizer` seam (OpenAI's
  BPE encodings, a model's ``tokenizer.json``, or an approximation).

Sans-IO: nothing here opens a socket or awaits.  Depends on :mod:`velvetrope.core`
(``Usage``) and :mod:`velvetrope.errors` only.
"""

from velvetrope.openai.errors import error_body, error_json, error_type_for
from velvetrope.openai.request import (
    CHAT_KEYS,
    COMPLETION_KEYS,
    MAX_N,
    CompletionRequest,
    Kind,
    count_prompt_tokens,
    parse,
    validate,
)
from velvetrope.openai.sse import DONE, SSE_HEADERS, error_event, json_event
from velvetrope.openai.tokenizer import ApproxTokenizer, Tokenizer, get_tokenizer

__all__ = [
    "CHAT_KEYS",
    "COMPLETION_KEYS",
    "DONE",
    "MAX_N",
    "SSE_HEADERS",
    "ApproxTokenizer",
    "CompletionRequest",
    "Kind",
    "Tokenizer",
    "count_prompt_tokens",
    "error_body",
    "error_event",
    "error_json",
    "error_type_for",
    "get_tokenizer",
    "json_event",
    "parse",
    "validate",
]
