"""What ``make fuzz`` sends: hypothesis strategies of OpenAI requests, valid and mutated.

A :class:`Probe` is one request and how to send it.  :func:`probes` draws one:

* most are a *valid-ish* body for ``/v1/chat/completions`` or ``/v1/completions`` (the
  fields of OpenAI's API and vLLM's, small values, ``stream`` either way), then mutated
  in its JSON (:func:`mutate`: a value of another type or null, a field removed, an unknown
  key, an absurd number such as ``max_tokens=10**12``, JSON nested past any limit, a long
  string) or in its bytes (truncated, garbage, invalid UTF-8, a lone surrogate, larger
  than ``max_body_bytes``, not an object), or sent with odd headers (no or a wrong key,
  another content type, a tier or an expected length asked for) or to another method or
  path;
* ``disconnect``: a valid streaming request whose client hangs up after the first token;
* ``raw``: bytes that are not HTTP at all, an upgrade to another protocol (WebSocket,
  h2c), or a valid body in chunked transfer encoding, written on a socket;
* ``stall``: a request whose body stops half-way, to meet the gateway's body timeout.

:func:`generate` draws a list of them with a fixed seed, the same list every time for a
seed *in a process that has loaded the same modules of ours*: hypothesis mixes the
constants it finds in the local modules loaded (``sys.modules``) into what it draws.  So
runs draw in a process of their own that loads only this module (:data:`DRAW_COMMAND`,
:func:`serve_chunks`), and a seed means the same probes in ``make fuzz`` and in the test
suite.  Sans-IO: nothing here opens a socket.
"""

from __future__ import annotations

import pickle
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import HypothesisWarning

__all__ = [
    "DRAW_COMMAND",
    "KEY",
    "MAX_BODY_BYTES",
    "MODEL",
    "TIGHT_KEY",
    "Probe",
    "Raw",
    "dump",
    "generate",
    "mutate",
    "probes",
    "serve_chunks",
    "valid_body",
]

MODEL = "velvetrope-sim"
KEY = "sk-fuzz-0000"
TIGHT_KEY = "sk-tight-0000"
"""A second tenant's key, with a small bucket: its requests meet 429s."""
MAX_BODY_BYTES = 64 * 1024
"""The gateway's ``max_body_bytes`` under fuzzing (oversized bodies stay cheap)."""

How = Literal["http", "disconnect", "raw", "stall"]


@dataclass(frozen=True)
class Probe:
    """One request: ``how`` it is sent, its ``method``, ``path``, ``headers`` and ``body``
    (for ``raw`` and ``stall``, every byte written on the socket), and a ``label`` saying
    what was done to it (reports group failures by it)."""

    how: How
    label: str
    body: bytes
    method: str = "POST"
    path: str = "/v1/chat/completions"
    headers: tuple[tuple[str, str], ...] = ()
    stream: bool = False


@dataclass(frozen=True)
class Raw:
    """JSON text to stand as is where it is placed in a body (numbers past 64 bits, nesting
    deeper than orjson writes)."""

    text: bytes = field(repr=False)


def dump(body: object) -> bytes:
    """``body`` as JSON, each :class:`Raw` written as its text."""
    raws: list[bytes] = []

    def default(obj: object) -> str:
        if isinstance(obj, Raw):
            raws.append(obj.text)
            return f"\x00{len(raws) - 1}\x00"
        raise TypeError(type(obj).__name__)

    out = orjson.dumps(body, default=default, option=orjson.OPT_PASSTHROUGH_DATACLASS)
    for i, text in enumerate(raws):
        out = out.replace(b'"\\u0000%d\\u0000"' % i, text, 1)
    return out


# -- valid-ish bodies -----------------------------------------------------------------------

TEXT = st.text(max_size=24)
SMALL_MAX = st.integers(1, 12)

_COMMON_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": SMALL_MAX,
    "stream": st.booleans(),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "n": st.sampled_from([1, None]),
    "stop": TEXT | st.lists(TEXT, max_size=3),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "logit_bias": st.dictionaries(
        st.integers(0, 100_000).map(str), st.integers(-100, 100), max_size=2
    ),
    "user": TEXT,
    "seed": st.integers(0, 2**31),
    "ignore_eos": st.booleans(),
    "top_k": st.integers(-1, 50),
    "min_tokens": st.integers(0, 2),
}
_TOOL = st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["lookup", "add"])},
        optional={"description": TEXT, "parameters": st.just({"type": "object"})},
    )}
)  # fmt: skip
_CHAT_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    **_COMMON_OPTIONAL,
    "max_completion_tokens": SMALL_MAX,
    "tools": st.lists(_TOOL, max_size=2),
    "tool_choice": st.sampled_from(["auto", "none"]),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    "parallel_tool_calls": st.booleans(),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 5),
}
_COMPLETION_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    **_COMMON_OPTIONAL,
    "echo": st.booleans(),
    "suffix": TEXT,
    "logprobs": st.integers(0, 5),
}

_PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.just({"type": "image_url", "image_url": {"url": "data:,"}}),
)
_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
_MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "developer"]), "content": TEXT},
        optional={"name": st.sampled_from(["ann", "bob"])},
    ),
    st.fixed_dictionaries(
        {"role": st.just("user"), "content": st.lists(_PART, min_size=1, max_size=3)}
    ),
    st.just({"role": "assistant", "content": None, "tool_calls": [_CALL]}),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": TEXT, "tool_call_id": st.just("c1")}
    ),
)
_PROMPT = st.one_of(
    TEXT,
    st.lists(st.integers(0, 50_000), min_size=1, max_size=8),
    st.lists(TEXT, min_size=1, max_size=2),
)


@st.composite
def valid_body(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    """A body OpenAI's API would take for ``kind`` (``chat`` or ``completions``), small."""
    required: dict[str, st.SearchStrategy[Any]] = {"model": st.just(MODEL)}
    if kind == "chat":
        required["messages"] = st.lists(_MESSAGE, min_size=1, max_size=4)
        body = draw(st.fixed_dictionaries(required, optional=_CHAT_OPTIONAL))
    else:
        required["prompt"] = _PROMPT
        body = draw(st.fixed_dictionaries(required, optional=_COMPLETION_OPTIONAL))
    if body.get("stream") is True and draw(st.booleans()):
        body["stream_options"] = {"include_usage": draw(st.booleans())}
    fresh: dict[str, Any] = orjson.loads(orjson.dumps(body))  # ours to mutate (st.just shares)
    return fresh


# -- mutations of the JSON ------------------------------------------------------------------

_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
_ANY_JSON = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
_ABSURD = st.sampled_from(
    [10**12, -1, 0, 2**63, 2**64 - 1, -(2**63), 1e308, -1e308, 0.5, 1e-300, 16, 17, 4097,
     Raw(b"1e400"), Raw(b"123456789012345678901234567890"), Raw(b"-0"), Raw(b"1E2")]
)  # fmt: skip
_DEPTHS = st.sampled_from([16, 127, 128, 129, 200, 254, 255, 256, 1023, 1024, 1025, 5000])


def nested(levels: int) -> Raw:
    """A value ``levels`` levels deep, arrays and objects by turns."""
    opens = "".join("[" if i % 2 else '{"k":' for i in range(levels))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(levels)))
    return Raw((opens + "1" + closes).encode())


Path = tuple[str | int, ...]


def _paths(value: Any, at: Path = ()) -> list[Path]:
    """Every path into ``value`` (the root ``()`` first)."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


def _at(body: Any, path: Path) -> Any:
    for step in path:
        body = body[step]
    return body


def _parent(body: Any, path: Path) -> Any:
    return _at(body, path[:-1])


_OPS: dict[str, Callable[[st.DrawFn], Any]] = {
    "retype": lambda draw: draw(_ANY_JSON),
    "absurd": lambda draw: draw(_ABSURD),
    "deep": lambda draw: nested(draw(_DEPTHS)),
    "long": lambda draw: "x" * draw(st.sampled_from([1_000, 20_000, 70_000])),
}


@st.composite
def mutate(draw: st.DrawFn, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``body`` with one to three mutations, and their labels (``op@path``)."""
    labels: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(
            st.sampled_from(["retype", "retype", "absurd", "delete", "unknown", "deep", "long"])
        )
        paths = _paths(body)
        if len(paths) == 1:  # the body was emptied by an earlier mutation: add to it
            op = "unknown"
        if op == "unknown":  # a key of ours, in the body or in an object inside it
            path = draw(st.sampled_from([p for p in paths if isinstance(_at(body, p), dict)]))
            key = draw(st.sampled_from(["bogus", "x-extra", "", "model2", "text", "type"]))
            _at(body, path)[key] = draw(_ANY_JSON)
            path = (*path, key)
        else:
            path = draw(st.sampled_from(paths[1:]))
            if op == "delete":
                del _parent(body, path)[path[-1]]
            else:
                _parent(body, path)[path[-1]] = _OPS[op](draw)
        labels.append(f"{op}@{'.'.join(map(str, path))}")
    return body, ",".join(labels)


# -- mutations of the bytes -----------------------------------------------------------------


@st.composite
def mangle(draw: st.DrawFn, raw: bytes) -> tuple[bytes, str]:
    """``raw`` spoilt as bytes: what a broken client or a proxy could make of a body."""
    op = draw(st.sampled_from(
        ["truncate", "garbage", "bad_utf8", "surrogate", "oversize", "not_object", "empty",
         "not_json"]
    ))  # fmt: skip
    at = draw(st.integers(0, max(0, len(raw) - 1)))
    if op == "truncate":
        return raw[:at], op
    if op == "garbage":
        return raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:], op
    if op == "bad_utf8":  # inside a string where there is one
        i = raw.find(b'":"')
        at = i + 3 if i >= 0 else at
        return raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"])) + raw[
            at:
        ], op
    if op == "surrogate":
        return raw.replace(b'":"', b'":"\\ud800', 1), op
    if op == "oversize":  # valid JSON, too large: trailing whitespace
        return raw + b" " * (MAX_BODY_BYTES + 1 - len(raw)), op
    if op == "not_object":
        return draw(st.sampled_from([b"[]", b"null", b"42", b'"text"', b"[{}]"])), op
    if op == "empty":
        return b"", op
    return draw(st.binary(max_size=40)), op


# -- headers, methods, paths ----------------------------------------------------------------

_AUTH = st.sampled_from(
    [None, "Bearer sk-wrong-0000", "Bearer", "Basic Zm9vOmJhcg==", f"bearer {KEY}",
     f"Bearer {TIGHT_KEY}", f"Bearer {TIGHT_KEY}", f"Bearer {TIGHT_KEY}",
     f"Bearer  {KEY} ", "Bearer \u00e9\u00e9"]
)  # fmt: skip
_CONTENT_TYPE = st.sampled_from(
    [None, "text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded",
     "application/json; charset=latin-1"]
)  # fmt: skip
_EXTRA_HEADERS = st.lists(
    st.tuples(
        st.sampled_from(
            ["x-velvetrope-tier", "x-velvetrope-expected-tokens", "x-velvetrope-progress"]
        ),
        st.sampled_from(["1", "0", "interactive", "batch", "nope", "-1", "1e3",
                         "99999999999999999999999", " 7 ", ""]),
    ),
    max_size=2,
)  # fmt: skip
_ODD_ROUTES = st.sampled_from(
    [("GET", "/v1/chat/completions"), ("PUT", "/v1/completions"), ("DELETE", "/v1/completions"),
     ("PATCH", "/v1/chat/completions"), ("OPTIONS", "/v1/completions"),
     ("POST", "/v1/chat/completions/"), ("POST", "/v1/nope"), ("POST", "/v1/models"),
     ("GET", "/v1/models/nope"), ("GET", "/admin/status"), ("POST", "//v1/completions")]
)  # fmt: skip

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def _headers(
    auth: str | None, content_type: str | None, extra: list[tuple[str, str]]
) -> tuple[tuple[str, str], ...]:
    hs = [("authorization", auth)] if auth is not None else []
    if content_type is not None:
        hs.append(("content-type", content_type))
    return (*hs, *extra)


GOOD_HEADERS = _headers(f"Bearer {KEY}", "application/json", [])


# -- not HTTP, and bodies that never end ---------------------------------------------------

_ODD_HTTP = [
    b"HELLO\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET /\x00 HTTP/1.1\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
    b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    # HTTP, but asking for another protocol (the connection closed after the answer)
    b"GET /v1/chat/completions HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade, close\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade, close\r\n"
    b"Content-Length: 2\r\n\r\n{}",
]


def _chunked(kind: str, body: bytes, size: int) -> bytes:
    """A request with ``body`` in chunks of ``size`` bytes (the connection closed after)."""
    head = (
        f"POST {_PATHS[kind]} HTTP/1.1\r\nHost: fuzz\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _stall(kind: str, chunked: bool) -> bytes:
    head = (
        f"POST {_PATHS[kind]} HTTP/1.1\r\nHost: fuzz\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    if chunked:
        return head + b'Transfer-Encoding: chunked\r\n\r\n8\r\n{"model"\r\n'
    return head + b'Content-Length: 200\r\n\r\n{"model":"' + MODEL.encode() + b'",'


# -- one probe ------------------------------------------------------------------------------


MIX: dict[str, int] = {
    "raw": 5,
    "chunked": 2,  # a valid body in chunked transfer encoding, written by hand
    "stall": 2,
    "disconnect": 6,
    "route": 5,  # another method or path
    "headers": 10,  # a valid body, odd headers (no key, a wrong one, another content type)
    "bytes": 12,  # a valid body spoilt as bytes
    "valid": 20,  # a valid body, with a tier or an expected length asked for now and then
    "json": 40,  # a valid body mutated in its JSON
}
"""How many in a hundred probes are of each sort (hypothesis favours the first a little)."""
_CATEGORIES = st.sampled_from([c for c, weight in MIX.items() for _ in range(weight)])


@st.composite
def probes(draw: st.DrawFn) -> Probe:
    """One request to send, of a sort drawn by :data:`MIX`."""
    category = draw(_CATEGORIES)
    kind = draw(st.sampled_from(["chat", "completions"]))
    if category == "raw":
        return Probe("raw", "odd_http", draw(st.sampled_from(_ODD_HTTP)))
    if category == "stall":
        chunked = draw(st.booleans())
        return Probe("stall", "stall_chunked" if chunked else "stall", _stall(kind, chunked))
    body = draw(valid_body(kind))
    method, path, headers = "POST", _PATHS[kind], GOOD_HEADERS
    if category == "chunked":
        return Probe("raw", f"{kind}:chunked", _chunked(kind, dump(body), draw(st.integers(1, 64))))
    if category == "disconnect":  # streamed, the client hangs up after the first token
        body.update(stream=True, n=1)
        body.pop("stream_options", None)
        return Probe("disconnect", f"{kind}:disconnect", dump(body), method, path, headers, True)
    stream = body.get("stream") is True
    label = f"{kind}:{category}"
    if category == "json":
        body, how = draw(mutate(body))
        label = f"{kind}:{how}"
    raw = dump(body)
    if category == "bytes":
        raw, how = draw(mangle(raw))
        label = f"{kind}:bytes:{how}"
    elif category == "valid":
        headers = (*GOOD_HEADERS, *draw(_EXTRA_HEADERS))
    elif category == "headers":
        headers = _headers(draw(_AUTH), draw(_CONTENT_TYPE), draw(_EXTRA_HEADERS))
    elif category == "route":
        method, path = draw(_ODD_ROUTES)
        label = f"{kind}:route:{method} {path}"
    return Probe("http", label, raw, method, path, headers, stream)


def generate(n: int, seed: int) -> list[Probe]:
    """``n`` probes drawn with hypothesis from ``seed`` (the same list for the same seed)."""
    out: list[Probe] = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis_seed(seed)
    @given(probes())
    def draw_all(p: Probe) -> None:
        out.append(p)

    draw_all()
    return out[:n]


def serve_chunks(chunks: list[str]) -> None:
    """The drawing process: for each ``SIZE:SEED`` of ``chunks``, that many probes drawn
    from that seed, pickled to stdout, each chunk after its length (8 bytes, big-endian)."""
    out = sys.stdout.buffer
    for chunk in chunks:
        size, seed = map(int, chunk.split(":"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HypothesisWarning)  # reprs of long strings
            data = pickle.dumps(generate(size, seed))
        out.write(len(data).to_bytes(8, "big") + data)
        out.flush()


DRAW_COMMAND = "import sys, harness.fuzz_requests as f; f.serve_chunks(sys.argv[1:])"
"""``python -c DRAW_COMMAND SIZE:SEED ...`` (from the repository's root): the drawing
process, loading nothing of ours but this module."""
