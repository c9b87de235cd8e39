"""Trace files: the built-in Azure traces, the CSV and JSONL readers, and the writer."""

from __future__ import annotations

import gzip
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from velvetrope.errors import PolicyError, TraceError
from velvetrope.sim.arrivals import Poisson
from velvetrope.sim.length_models import TraceLengths
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import (
    BUILTIN_TRACES,
    builtin_trace,
    load_trace,
    read_azure_csv,
    read_jsonl,
    write_jsonl,
)
from velvetrope.sim.workload import index_of_dispersion, synthesize, trace_stats

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.fixture(scope="module")
def conv() -> list[TraceRequest]:
    return load_trace("azure_conv")


@pytest.fixture(scope="module")
def code() -> list[TraceRequest]:
    return load_trace("azure_code")


# --------------------------------------------------------------------------- built-in traces


@pytest.mark.parametrize(("name", "rows"), [("azure_conv", 19_366), ("azure_code", 8_819)])
def test_builtin_trace_shape(name: str, rows: int, conv: list[TraceRequest],
                             code: list[TraceRequest]) -> None:  # fmt: skip
    trace = conv if name == "azure_conv" else code
    assert len(trace) == rows
    assert trace[0].t == 0.0
    t = np.array([r.t for r in trace])
    assert np.all(np.diff(t) >= 0.0)
    assert all(r.tenant == "default" and r.tier is None and r.max_tokens is None for r in trace)
    assert builtin_trace(name).is_file()


def test_conv_matches_readme(conv: list[TraceRequest]) -> None:
    s = trace_stats(conv)
    assert s.count == 19_366
    assert 55 * 60 < s.span_s < 60 * 60
    assert s.mean_rps == pytest.approx(5.5, abs=0.1)
    assert s.prompt_p50 == pytest.approx(1020, rel=0.01)
    assert s.prompt_p99 == pytest.approx(4142, rel=0.02)
    assert s.output_p50 == pytest.approx(129, rel=0.01)
    assert s.output_p99 == pytest.approx(601, rel=0.02)
    assert s.output_scv == pytest.approx(0.6, abs=0.05)
    assert index_of_dispersion(conv, 1.0) == pytest.approx(1.4, abs=0.1)


def test_code_matches_readme(code: list[TraceRequest]) -> None:
    s = trace_stats(code)
    assert s.count == 8_819
    assert s.mean_rps == pytest.approx(2.6, abs=0.1)
    assert s.prompt_p50 == pytest.approx(1469, rel=0.01)
    assert s.output_p50 == pytest.approx(13, abs=1)
    assert s.output_scv == pytest.approx(4.6, abs=0.2)
    assert s.interarrival_cv == pytest.approx(13, rel=0.1)


def test_first_rows_exact(conv: list[TraceRequest]) -> None:
    # 18:15:46.6805900 -> 18:15:50.9951690: 4.314579 s; 7-digit fractions kept exactly.
    assert conv[0] == TraceRequest(0.0, 374, 44)
    assert conv[1].t == pytest.approx(4.314579, abs=1e-9)
    assert (conv[1].prompt_tokens, conv[1].output_tokens) == (396, 109)


def test_unknown_builtin_and_format(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="azure_code, azure_conv"):
        builtin_trace("azure_chat")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(tmp_path / "trace.parquet")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace("azure_chat")
    assert set(BUILTIN_TRACES) == {"azure_conv", "azure_code", "mooncake_conv"}


# --------------------------------------------------------------------------- Azure CSV


def _csv(tmp_path: Path, body: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(body, encoding="utf-8")
    return p


def test_csv_timestamps(tmp_path: Path) -> None:
    p = _csv(
        tmp_path,
        HEADER + "2023-11-16 23:59:59.9000000,10,1\n"
        "2023-11-17 00:00:00.1234567,20,2\n"  # across midnight
        "2023-11-17T00:00:01,30,3\n"  # no fraction, T separator
        "2023-11-17 00:00:01.000000001,40,4\n",  # 9 digits
    )
    t = [r.t for r in read_azure_csv(p)]
    assert t == pytest.approx([0.0, 0.2234567, 1.1, 1.100000001], abs=1e-12)


def test_csv_time_zones(tmp_path: Path) -> None:
    p = _csv(
        tmp_path,
        HEADER + "2024-05-10 00:00:00.0+00:00,10,1\n"
        "2024-05-10 02:00:01.5+02:00,10,1\n"  # = 00:00:01.5 UTC
        "2024-05-10 00:00:03Z,10,1\n",
    )
    assert [r.t for r in load_trace(p)] == pytest.approx([0.0, 1.5, 3.0])


def test_csv_out_of_order_rows_are_sorted(tmp_path: Path) -> None:
    p = _csv(
        tmp_path,
        HEADER + "2023-11-16 18:00:02.0,2,1\n2023-11-16 18:00:01.0,1,1\n"
        "2023-11-16 18:00:03.0,3,1\n2023-11-16 18:00:01.0,4,1\n",
    )
    rows = read_azure_csv(p)
    assert [(r.t, r.prompt_tokens) for r in rows] == [(0.0, 1), (0.0, 4), (1.0, 2), (2.0, 3)]


def test_csv_flexible_header(tmp_path: Path) -> None:
    p = _csv(
        tmp_path,
        "\ufeffgeneratedtokens, Extra ,timestamp,CONTEXTTOKENS\r\n"
        "7,x,2023-11-16 18:00:00,100\r\n\r\n8,y,2023-11-16 18:00:00.5,200\r\n",
    )
    rows = read_azure_csv(p)
    assert rows == [TraceRequest(0.0, 100, 7), TraceRequest(0.5, 200, 8)]


def test_csv_gzip_and_header_only(tmp_path: Path) -> None:
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(gzip.compress((HEADER + "2023-11-16 18:00:00,5,6\n").encode()))
    assert load_trace(gz) == [TraceRequest(0.0, 5, 6)]
    assert read_azure_csv(_csv(tmp_path, HEADER)) == []


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("", 1, "empty file"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,5\n", 1, "GeneratedTokens"),
        (HEADER + "2023-11-16 18:00:00,5,6\n2023-11-16 18:00:01,5\n", 3, "at least 3 fields"),
        (HEADER + "2023-11-16 18:00:00,5,6\n16/11/2023 18:00:01,5,6\n", 3, "bad TIMESTAMP"),
        (HEADER + "2023-02-30 18:00:00,5,6\n", 2, "bad date"),
        (HEADER + "2023-11-16 25:00:00,5,6\n", 2, "bad time of day"),
        (HEADER + "2023-11-16 18:00:00.12345678901,5,6\n", 2, "bad TIMESTAMP"),
        (HEADER + "2023-11-16 18:00:00,5.5,6\n", 2, "ContextTokens must be an integer"),
        (HEADER + "2023-11-16 18:00:00,0,6\n", 2, "ContextTokens must be >= 1"),
        (HEADER + "2023-11-16 18:00:00,5,-6\n", 2, "GeneratedTokens must be >= 0"),
        (HEADER + "2023-11-16 18:00:00,5,\n", 2, "GeneratedTokens must be an integer"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path: Path, body: str, line: int, message: str) -> None:
    p = _csv(tmp_path, body)
    with pytest.raises(TraceError, match=message) as info:
        read_azure_csv(p)
    assert str(info.value).startswith(f"{p}:{line}: ")


def test_csv_not_utf8_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_bytes(HEADER.encode() + b"2023-11-16 18:00:00,5,\xff\n")
    with pytest.raises(TraceError, match="not UTF-8") as info:
        read_azure_csv(p)
    assert str(p) in str(info.value)
    with pytest.raises(TraceError, match="cannot open"):
        load_trace(tmp_path / "missing.csv")


# --------------------------------------------------------------------------- JSONL


SAMPLE = [
    TraceRequest(0.0, 812, 97, "gold", "tier-1"),
    TraceRequest(0.1 + 0.2, 40, 5, "bronze", None, 256),
    TraceRequest(0.3000000000000001, 1, 0, "bronze", "tier-3", 1),
    TraceRequest(12.5, 7000, 1500, "silver"),
]


@pytest.mark.parametrize("name", ["w.jsonl", "w.jsonl.gz"])
def test_jsonl_round_trip(tmp_path: Path, name: str) -> None:
    p = tmp_path / name
    write_jsonl(SAMPLE, p)
    assert load_trace(p) == SAMPLE
    assert [x.name for x in tmp_path.iterdir()] == [name]  # no temporary file left behind


def test_jsonl_layout(tmp_path: Path) -> None:
    p = tmp_path / "w.jsonl"
    write_jsonl(SAMPLE[:2], p)
    assert p.read_text().splitlines() == [
        '{"t":0.0,"tenant":"gold","tier":"tier-1","prompt_tokens":812,"output_tokens":97}',
        '{"t":0.30000000000000004,"tenant":"bronze","prompt_tokens":40,"output_tokens":5,'
        '"max_tokens":256}',
    ]


def test_jsonl_tolerates_blank_lines_and_keeps_times(tmp_path: Path) -> None:
    p = tmp_path / "w.jsonl"
    p.write_text(
        '\n{"t": 3, "tenant": "a", "prompt_tokens": 1, "output_tokens": 2, "tier": null}\n'
        '   \n{"t": 3.5, "tenant": "a", "prompt_tokens": 1, "output_tokens": 2,'
        ' "max_tokens": null}\n'
    )
    assert read_jsonl(p) == [TraceRequest(3.0, 1, 2, "a"), TraceRequest(3.5, 1, 2, "a")]
    assert read_jsonl(_csv(tmp_path, "", "empty.jsonl")) == []


GOOD = '{"t": 0.5, "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"t": 1.0, "tenant": "a", "prompt_tokens": 10', "invalid JSON"),
        ("not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"t": 1, "tenant": "a", "prompt_tokens": 10}', "missing required key.*'output_tokens'"),
        ('{"tenant": "a", "prompt_tokens": 10, "output_tokens": 3}', "missing required key.*'t'"),
        ('{"t": 1, "tenant": "a", "prompt_tokens": 1, "output_tokens": 3, "prio": 1}',
         "unknown key.*'prio'"),
        ('{"t": 1, "t": 2, "tenant": "a", "prompt_tokens": 1, "output_tokens": 3}',
         "'t' appears twice"),
        ('{"t": "1", "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}',
         "'t' must be a number"),
        ('{"t": true, "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}',
         "'t' must be a number"),
        ('{"t": 1, "tenant": "a", "prompt_tokens": 10.0, "output_tokens": 3}',
         "'prompt_tokens' must be an integer"),
        ('{"t": 1, "tenant": "a", "prompt_tokens": 10, "output_tokens": false}',
         "'output_tokens' must be an integer"),
        ('{"t": 1, "tenant": 7, "prompt_tokens": 10, "output_tokens": 3}',
         "'tenant' must be a string"),
        ('{"t": 1, "tenant": "", "prompt_tokens": 10, "output_tokens": 3}',
         "tenant must be a non-empty string"),
        ('{"t": 1, "tenant": "a", "tier": 1, "prompt_tokens": 10, "output_tokens": 3}',
         "'tier' must be a string or null"),
        ('{"t": 1, "tenant": "a", "prompt_tokens": 10, "output_tokens": 3, "max_tokens": "8"}',
         "'max_tokens' must be an integer or null"),
        ('{"t": 1, "tenant": "a", "prompt_tokens": -10, "output_tokens": 3}',
         "prompt_tokens must be >= 1"),
        ('{"t": 1, "tenant": "a", "prompt_tokens": 10, "output_tokens": -3}',
         "output_tokens must be >= 0"),
        ('{"t": 1, "tenant": "a", "prompt_tokens": 10, "output_tokens": 30, "max_tokens": 20}',
         r"output_tokens \(30\) exceeds max_tokens \(20\)"),
        ('{"t": NaN, "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}',
         "'t' must be finite"),
        ('{"t": Infinity, "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}',
         "'t' must be finite"),
        ('{"t": 1e999, "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}',
         "'t' must be finite"),
        ('{"t": -0.5, "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}', ">= 0"),
        ('{"t": 1' + "0" * 400 + ', "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}',
         "'t' must be finite"),
        ('{"t": 0.25, "tenant": "a", "prompt_tokens": 10, "output_tokens": 3}',
         "before t=0.5 on line 3; JSONL workloads must be sorted by t"),
    ],
)  # fmt: skip
def test_jsonl_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(f"{GOOD}\n\n{GOOD}\n{line}\n{GOOD}\n", encoding="utf-8")
    with pytest.raises(TraceError, match=message) as info:
        read_jsonl(p)
    assert str(info.value).startswith(f"{p}:4: ")


def test_jsonl_not_utf8_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_bytes(GOOD.encode() + b'\n{"t": 1, "tenant": "\xff"}\n')
    with pytest.raises(TraceError, match="not UTF-8") as info:
        read_jsonl(p)
    assert str(info.value).startswith(f"{p}:2: ")


def test_jsonl_missing_and_corrupt_gzip(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open") as info:
        read_jsonl(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in str(info.value)
    p = tmp_path / "w.jsonl.gz"
    p.write_bytes(b"definitely not gzip")
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(p)


def test_write_jsonl_rejects_unsorted_and_writes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "w.jsonl"
    with pytest.raises(PolicyError, match="sorted"):
        write_jsonl([TraceRequest(1.0, 1, 1), TraceRequest(0.5, 1, 1)], p)
    assert list(tmp_path.iterdir()) == []


_names = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8)
_requests = st.builds(
    TraceRequest,
    t=st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False),
    prompt_tokens=st.integers(1, 200_000),
    output_tokens=st.integers(0, 50_000),
    tenant=_names,
    tier=st.none() | _names,
    max_tokens=st.none() | st.just(60_000),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_requests, max_size=20))
def test_jsonl_round_trip_property(requests: list[TraceRequest]) -> None:
    requests.sort(key=lambda r: r.t)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "w.jsonl"
        write_jsonl(requests, p)
        assert read_jsonl(p) == requests


def test_synthetic_workload_round_trips(tmp_path: Path, code: list[TraceRequest]) -> None:
    times = Poisson(3.0).times(17, duration=120.0)
    mix = TenantMix.parse("gold:tier-1:0.2,silver:tier-2:0.3,bronze:tier-3:0.5")
    work = synthesize(times, TraceLengths(code), seed=17, mix=mix, max_tokens=512)
    p = tmp_path / "synthetic.jsonl"
    write_jsonl(work, p)
    back = load_trace(p)
    assert back == work
    assert all(math.isfinite(r.t) and r.max_tokens == 512 for r in back)
