"""Trace files: reading recorded workloads, writing our own, finding the built-in ones.

Two formats, chosen by suffix (either may be gzipped, ``.csv.gz`` / ``.jsonl.gz``):

**Azure CSV** (``.csv``), the format of the Azure LLM inference traces (AzurePublicDataset):
a header row naming at least ``TIMESTAMP``, ``ContextTokens`` and ``GeneratedTokens`` (matched
case-insensitively; other columns are ignored), then one request per row.  Timestamps look
like ``2023-11-16 18:15:46.6805900``: ISO date and time with up to 9 fractional digits (more
than :meth:`datetime.fromisoformat` takes in Python 3.11) and an optional ``Z`` / ``±HH:MM``
offset; times without an offset are taken as UTC.  Rows out of order are *sorted* (stably) by
timestamp, and times are rebased so that the earliest request arrives at ``t = 0.0``.  Every
request gets tenant ``"default"``, no tier and no ``max_tokens``; assign tenants with
:class:`~velvetrope.sim.tenant_mix.TenantMix`.

**JSONL** (``.jsonl``), ours: one JSON object per line, blank lines ignored::

    {"t": 0.0, "tenant": "gold", "prompt_tokens": 812, "output_tokens": 97}
    {"t": 0.31, "tenant": "bronze", "tier": "tier-3", "prompt_tokens": 40, "output_tokens": 5,
     "max_tokens": 256}

Required keys: ``t`` (seconds, a finite number ``>= 0``), ``tenant`` (non-empty string),
``prompt_tokens`` (integer ``>= 1``), ``output_tokens`` (integer ``>= 0``); optional: ``tier``
(non-empty string or null), ``max_tokens`` (integer ``>= output_tokens`` and ``>= 1``, or
null), ``prefix_id`` (string or null) and ``prefix_tokens`` (integer ``<= prompt_tokens``:
the shared prompt prefix of :class:`~velvetrope.sim.trace_request.TraceRequest`), ``model``
(non-empty string or null: the requested model, which routing rules see), ``block_hashes``
(a list of integers: the chained hashes of the prompt's leading blocks) with
``block_tokens`` (integer ``>= 1``, the tokens a block), ``endpoint`` (the endpoint kind,
default ``chat``: ``chat``, ``completions``, ``responses``, ``messages``, ``embeddings`` or
``rerank``, not ``passthrough``, whose work a trace cannot tell; an ``embeddings`` or
``rerank`` line is prompt-only work, its ``output_tokens`` 0 and no ``max_tokens``, e.g.
``{"t": 1.5, "tenant": "bronze", "endpoint": "embeddings", "prompt_tokens": 300,
"output_tokens": 0}``).  Unknown or
repeated keys and wrong types are errors.  ``t`` must be non-decreasing
from line to line: an unsorted JSONL file is *rejected*, not sorted, since it is the format
we write (:func:`write_jsonl` always writes sorted output) and disorder there means a broken
producer.  Times are kept as written (not rebased), so a write/read round trip is exact.

Every problem with a file raises :class:`~velvetrope.errors.TraceError` whose message starts
with ``<file>:<line>:`` and says what is wrong.

**Mooncake** (``.jsonl`` whose first record has ``timestamp`` and ``hash_ids``): the
prefix-sharing traces of Mooncake (FAST 2025), read by
:func:`~velvetrope.sim.mooncake.read_mooncake`.

Built-in traces, by short name (:data:`BUILTIN_TRACES`): ``azure_conv``, ``azure_code`` and
``mooncake_conv``, shipped as package data (see ``velvetrope/data/traces/README.md`` for
their source and license).  :func:`load_trace` takes a built-in name or a path.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from datetime import date
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TextIO, TypeAlias

from velvetrope.errors import PolicyError, TraceError
from velvetrope.sim.mooncake import is_mooncake_record, read_mooncake
from velvetrope.sim.trace_request import TraceRequest

__all__ = [
    "BUILTIN_TRACES",
    "builtin_trace",
    "load_trace",
    "read_azure_csv",
    "read_jsonl",
    "write_jsonl",
]

PathLike: TypeAlias = str | os.PathLike[str]

BUILTIN_TRACES: Mapping[str, str] = {
    "azure_code": "azure_llm_2023_code.csv",
    "azure_conv": "azure_llm_2023_conv.csv",
    "mooncake_conv": "mooncake_conversation_trace.jsonl.gz",
}
"""Short name -> file name under ``velvetrope/data/traces/``."""


def builtin_trace(name: str) -> Traversable:
    """The packaged file of built-in trace ``name`` (a key of :data:`BUILTIN_TRACES`).

    An unknown name raises :class:`~velvetrope.errors.PolicyError` listing the known ones.
    """
    try:
        filename = BUILTIN_TRACES[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(BUILTIN_TRACES))
        raise PolicyError(f"unknown built-in trace {name!r}; known: {known}") from None
    return resources.files("velvetrope.data").joinpath("traces").joinpath(filename)


def load_trace(source: PathLike) -> list[TraceRequest]:
    """Read a trace: a built-in name (``azure_conv``, ``azure_code``, ``mooncake_conv``) or a
    file path.

    Paths dispatch on suffix: ``.csv`` / ``.csv.gz`` to :func:`read_azure_csv`, ``.jsonl`` /
    ``.jsonl.gz`` to :func:`read_jsonl`, or to
    :func:`~velvetrope.sim.mooncake.read_mooncake` when the first record is Mooncake's;
    anything else raises :class:`~velvetrope.errors.TraceError`.
    """
    if isinstance(source, str) and source in BUILTIN_TRACES:
        with resources.as_file(builtin_trace(source)) as path:
            return load_trace(path)
    path = Path(source)
    if path.name.lower().endswith((".jsonl", ".jsonl.gz")) and _first_is_mooncake(path):
        return read_mooncake(path)
    name = path.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        return read_azure_csv(path)
    if name.endswith((".jsonl", ".jsonl.gz")):
        return read_jsonl(path)
    known = ", ".join(sorted(BUILTIN_TRACES))
    raise TraceError(
        f"{path}: unknown trace format; expected a .csv or .jsonl file (optionally .gz) "
        f"or a built-in trace name ({known})"
    )


# --------------------------------------------------------------------------- file access


def _first_is_mooncake(path: Path) -> bool:
    """Whether the first non-blank line of ``path`` is a Mooncake record (unreadable or
    not JSON: no, and the JSONL reader says what is wrong)."""
    try:
        with _open_lines(path) as lines:
            for raw in lines:
                if raw.strip():
                    try:
                        return is_mooncake_record(json.loads(raw))
                    except ValueError:
                        return False
    except (OSError, EOFError, TraceError):
        return False
    return False


@contextmanager
def _open_lines(path: Path) -> Iterator[Iterable[bytes]]:
    """The lines of ``path`` as bytes, gunzipped for ``*.gz``; TraceError if it won't open."""
    with ExitStack() as stack:
        lines: Iterable[bytes]
        try:
            if path.suffix == ".gz":
                lines = stack.enter_context(gzip.GzipFile(path, "rb"))
            else:
                lines = stack.enter_context(open(path, "rb"))
        except OSError as e:
            raise TraceError(f"{path}: cannot open: {e.strerror or e}") from e
        yield lines


@contextmanager
def _open_csv(path: Path) -> Iterator[TextIO]:
    """``path`` as UTF-8 text for the csv module (BOM tolerated, gunzipped for ``*.gz``)."""
    with ExitStack() as stack:
        f: TextIO
        try:
            if path.suffix == ".gz":
                f = stack.enter_context(gzip.open(path, "rt", encoding="utf-8-sig", newline=""))
            else:
                f = stack.enter_context(open(path, encoding="utf-8-sig", newline=""))
        except OSError as e:
            raise TraceError(f"{path}: cannot open: {e.strerror or e}") from e
        yield f


def _fail(path: Path, line: int, what: str) -> TraceError:
    return TraceError(f"{path}:{line}: {what}")


# --------------------------------------------------------------------------- Azure CSV

_TIMESTAMP = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?"
)
_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _epoch_ns(text: str, days: dict[str, int]) -> tuple[int, int]:
    """``(whole seconds, nanoseconds)`` since 0001-01-01 UTC; ValueError if malformed."""
    m = _TIMESTAMP.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"bad TIMESTAMP {text!r}; expected like '2023-11-16 18:15:46.6805900'")
    day_text, hh, mm, ss, frac, tz = m.groups()
    day = days.get(day_text)
    if day is None:
        try:
            day = date.fromisoformat(day_text).toordinal()
        except ValueError:
            raise ValueError(f"bad date in TIMESTAMP {text!r}") from None
        days[day_text] = day
    h, mi, s = int(hh), int(mm), int(ss)
    if h > 23 or mi > 59 or s > 59:
        raise ValueError(f"bad time of day in TIMESTAMP {text!r}")
    seconds = day * 86400 + h * 3600 + mi * 60 + s
    if tz is not None and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return seconds, int(frac.ljust(9, "0")) if frac else 0


def _token_field(path: Path, line: int, column: str, text: str, minimum: int) -> int:
    try:
        n = int(text)
    except ValueError:
        raise _fail(path, line, f"{column} must be an integer, got {text!r}") from None
    if n < minimum:
        raise _fail(path, line, f"{column} must be >= {minimum}, got {n}")
    return n


def read_azure_csv(path: PathLike) -> list[TraceRequest]:
    """Read an Azure LLM inference trace CSV (see the module docstring for the format).

    Returns the requests sorted by time, the first at ``t = 0.0``, tenant ``"default"``.
    A header-only file gives an empty list.
    """
    p = Path(path)
    rows: list[tuple[int, int, int, int]] = []
    days: dict[str, int] = {}
    try:
        with _open_csv(p) as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise _fail(p, 1, "empty file; expected a header row " + ", ".join(_COLUMNS))
            index = {name.strip().lower(): i for i, name in enumerate(header)}
            missing = [c for c in _COLUMNS if c.lower() not in index]
            if missing:
                raise _fail(p, 1, f"header lacks column(s) {', '.join(missing)}; got {header}")
            it, ip, io_ = (index[c.lower()] for c in _COLUMNS)
            width = max(it, ip, io_) + 1
            for row in reader:
                if not row:
                    continue
                line = reader.line_num
                if len(row) < width:
                    raise _fail(p, line, f"expected at least {width} fields, got {len(row)}")
                try:
                    sec, ns = _epoch_ns(row[it], days)
                except ValueError as e:
                    raise _fail(p, line, str(e)) from None
                prompt = _token_field(p, line, "ContextTokens", row[ip], 1)
                output = _token_field(p, line, "GeneratedTokens", row[io_], 0)
                rows.append((sec, ns, prompt, output))
    except csv.Error as e:
        raise TraceError(f"{p}: malformed CSV: {e}") from e
    except UnicodeDecodeError as e:
        raise TraceError(f"{p}: not UTF-8 text: {e}") from e
    except (OSError, EOFError) as e:
        raise TraceError(f"{p}: cannot read: {e}") from e
    if any(rows[i][:2] < rows[i - 1][:2] for i in range(1, len(rows))):
        rows.sort(key=lambda r: (r[0], r[1]))
    if not rows:
        return []
    sec0, ns0 = rows[0][0], rows[0][1]
    return [
        TraceRequest((sec - sec0) + (ns - ns0) * 1e-9, prompt, output)
        for sec, ns, prompt, output in rows
    ]


# --------------------------------------------------------------------------- JSONL

_REQUIRED = frozenset({"t", "tenant", "prompt_tokens", "output_tokens"})
_OPTIONAL = frozenset(
    {
        "tier", "max_tokens", "prefix_id", "prefix_tokens", "model", "block_hashes",
        "block_tokens", "endpoint",
    }
)  # fmt: skip


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r} appears twice")
        obj[key] = value
    return obj


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_record(obj: object) -> TraceRequest:
    """One JSONL object -> request; ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    keys = obj.keys()
    unknown = sorted(keys - _REQUIRED - _OPTIONAL)
    if unknown:
        allowed = ", ".join(sorted(_REQUIRED | _OPTIONAL))
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {allowed}")
    missing = sorted(_REQUIRED - keys)
    if missing:
        raise ValueError(f"missing required key(s) {', '.join(map(repr, missing))}")
    t = obj["t"]
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise ValueError(f"'t' must be a number, got {t!r}")
    try:
        finite = math.isfinite(t)
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite or t < 0:
        raise ValueError(f"'t' must be finite and >= 0, got {t!r}")
    for key in ("prompt_tokens", "output_tokens"):
        if not _is_int(obj[key]):
            raise ValueError(f"{key!r} must be an integer, got {obj[key]!r}")
    if not isinstance(obj["tenant"], str):
        raise ValueError(f"'tenant' must be a string, got {obj['tenant']!r}")
    tier = obj.get("tier")
    if tier is not None and not isinstance(tier, str):
        raise ValueError(f"'tier' must be a string or null, got {tier!r}")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and not _is_int(max_tokens):
        raise ValueError(f"'max_tokens' must be an integer or null, got {max_tokens!r}")
    prefix_id = obj.get("prefix_id")
    if prefix_id is not None and not isinstance(prefix_id, str):
        raise ValueError(f"'prefix_id' must be a string or null, got {prefix_id!r}")
    prefix_tokens = obj.get("prefix_tokens", 0)
    if not _is_int(prefix_tokens):
        raise ValueError(f"'prefix_tokens' must be an integer, got {prefix_tokens!r}")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"'model' must be a string or null, got {model!r}")
    hashes = obj.get("block_hashes", [])
    if not isinstance(hashes, list) or not all(_is_int(h) for h in hashes):
        raise ValueError(f"'block_hashes' must be a list of integers, got {hashes!r}")
    block_tokens = obj.get("block_tokens", 0)
    if not _is_int(block_tokens):
        raise ValueError(f"'block_tokens' must be an integer, got {block_tokens!r}")
    endpoint = obj.get("endpoint", "chat")
    if not isinstance(endpoint, str):
        raise ValueError(f"'endpoint' must be a string, got {endpoint!r}")
    try:
        return TraceRequest(
            t, obj["prompt_tokens"], obj["output_tokens"], obj["tenant"], tier, max_tokens,
            prefix_id, prefix_tokens, model, tuple(hashes), block_tokens, endpoint,
        )  # fmt: skip
    except PolicyError as e:
        raise ValueError(str(e)) from None


def read_jsonl(path: PathLike) -> list[TraceRequest]:
    """Read a JSONL workload (see the module docstring for the format and its checks).

    Returns the requests in file order, which is sorted by ``t``; an empty file gives an
    empty list.
    """
    p = Path(path)
    out: list[TraceRequest] = []
    prev_t = 0.0
    prev_line = 0
    try:
        with _open_lines(p) as lines:
            for lineno, raw in enumerate(lines, start=1):
                try:
                    line = raw.decode("utf-8-sig")
                except UnicodeDecodeError as e:
                    raise _fail(p, lineno, f"not UTF-8 text: {e.reason}") from None
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line, object_pairs_hook=_no_duplicates)
                except json.JSONDecodeError as e:
                    raise _fail(p, lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
                except ValueError as e:  # from _no_duplicates
                    raise _fail(p, lineno, str(e)) from None
                try:
                    req = _parse_record(obj)
                except ValueError as e:
                    raise _fail(p, lineno, str(e)) from None
                if out and req.t < prev_t:
                    raise _fail(
                        p,
                        lineno,
                        f"t={req.t!r} is before t={prev_t!r} on line {prev_line}; "
                        "JSONL workloads must be sorted by t",
                    )
                prev_t, prev_line = req.t, lineno
                out.append(req)
    except (OSError, EOFError) as e:
        raise TraceError(f"{p}: cannot read: {e}") from e
    return out


def _record(r: TraceRequest) -> dict[str, object]:
    obj: dict[str, object] = {"t": r.t, "tenant": r.tenant}
    if r.tier is not None:
        obj["tier"] = r.tier
    obj["prompt_tokens"] = r.prompt_tokens
    obj["output_tokens"] = r.output_tokens
    if r.max_tokens is not None:
        obj["max_tokens"] = r.max_tokens
    if r.prefix_id is not None:
        obj["prefix_id"] = r.prefix_id
        obj["prefix_tokens"] = r.prefix_tokens
    if r.model is not None:
        obj["model"] = r.model
    if r.block_hashes:
        obj["block_hashes"] = list(r.block_hashes)
        obj["block_tokens"] = r.block_tokens
    if r.endpoint != "chat":
        obj["endpoint"] = r.endpoint
    return obj


def write_jsonl(requests: Sequence[TraceRequest], path: PathLike) -> None:
    """Write ``requests`` as JSONL (gzipped if ``path`` ends in ``.gz``), atomically.

    ``requests`` must be sorted by ``t`` (else :class:`~velvetrope.errors.PolicyError`, and
    nothing is written).  Keys ``tier``, ``max_tokens``, ``prefix_id``/``prefix_tokens`` and
    ``model`` are written only when set.  Floats are written in shortest round-trip form, so
    :func:`read_jsonl` gives back equal requests.
    The file appears complete or not at all (written to a temporary file, then renamed);
    I/O failures raise :class:`OSError`.
    """
    for i in range(1, len(requests)):
        if requests[i].t < requests[i - 1].t:
            raise PolicyError(
                f"write_jsonl: requests must be sorted by t; request {i} at "
                f"t={requests[i].t!r} comes after t={requests[i - 1].t!r}"
            )
    p = Path(path)
    body = "".join(
        json.dumps(_record(r), separators=(",", ":"), allow_nan=False) + "\n" for r in requests
    ).encode("utf-8")
    if p.suffix == ".gz":
        body = gzip.compress(body, mtime=0)
    # A sibling temporary file, opened exclusively (so it honours the umask, unlike mkstemp).
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(body)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
