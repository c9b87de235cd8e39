"""Mooncake's trace format, block hashes in the engine model, and routing on them."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.core import PolicyConfig
from velvetrope.engine import Batcher, load_profile
from velvetrope.errors import PolicyError, TraceError
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.mooncake import read_mooncake
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace, read_jsonl, write_jsonl

LINES = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 250, "input_length": 1600, "output_length": 7, "hash_ids": [0, 1, 3, 4]},
    {"timestamp": 250, "input_length": 300, "output_length": 0, "hash_ids": [9]},
]


def write(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_records_become_requests_with_block_hashes(tmp_path: Path) -> None:
    got = read_mooncake(write(tmp_path / "m.jsonl", LINES))
    assert [(r.t, r.prompt_tokens, r.output_tokens) for r in got] == [
        (0.0, 1100, 5),
        (0.25, 1600, 7),
        (0.25, 300, 0),
    ]
    assert got[1].block_hashes == (0, 1, 3, 4) and got[1].block_tokens == 512
    assert load_trace(tmp_path / "m.jsonl") == got  # told apart from our JSONL by its keys
    gz = tmp_path / "m.jsonl.gz"
    gz.write_bytes(gzip.compress((tmp_path / "m.jsonl").read_bytes()))
    assert load_trace(gz) == got


@pytest.mark.parametrize(
    ("row", "what"),
    [
        ({"timestamp": 0, "input_length": 10, "output_length": 1}, "missing \\['hash_ids'\\]"),
        ({**LINES[0], "tenant": "a"}, "unknown \\['tenant'\\]"),
        ({**LINES[0], "hash_ids": [0, "x"]}, "hash_ids"),
        ({**LINES[0], "input_length": 0}, "prompt_tokens"),
        ({**LINES[0], "timestamp": 1.5}, "timestamp"),
    ],
)
def test_bad_mooncake_records_name_their_line(tmp_path: Path, row: object, what: str) -> None:
    with pytest.raises(TraceError, match=rf"m\.jsonl:2: .*{what}"):
        read_mooncake(write(tmp_path / "m.jsonl", [LINES[0], row]))


def test_a_disordered_mooncake_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"m\.jsonl:2: timestamp goes back"):
        read_mooncake(write(tmp_path / "m.jsonl", [LINES[1], LINES[0]]))


def test_the_conversation_trace_ships_built_in() -> None:
    moon = load_trace("mooncake_conv")
    assert len(moon) == 12_031
    assert moon[0].block_hashes == tuple(range(14)) and moon[0].prompt_tokens == 6758
    assert all(r.block_tokens == 512 for r in moon[:100])


def test_our_jsonl_round_trips_block_hashes(tmp_path: Path) -> None:
    work = [TraceRequest(0.0, 300, 5, block_hashes=(7, 2**63 + 5), block_tokens=128)]
    write_jsonl(work, tmp_path / "w.jsonl")
    assert read_jsonl(tmp_path / "w.jsonl") == work
    with pytest.raises(PolicyError, match="block_tokens"):
        TraceRequest(0.0, 300, 5, block_hashes=(1,), block_tokens=0)


def test_the_engine_model_reuses_blocks_named_by_hashes() -> None:
    prof = load_profile("llama3-8b-h100").with_overrides(enable_prefix_caching=True)
    b = Batcher(prof)
    b.add("a", 1100, 1, 0.0, block_ids=[0, 1, 2], block_tokens=512)
    while b.has_work:
        b.step(0.0)
    b.add("b", 1600, 1, 1.0, block_ids=[0, 1, 3, 4], block_tokens=512)
    b.step(1.0)
    # b shares blocks 0 and 1 (1,024 tokens) with a; a's partial block 2 is not shared
    assert b.prefix_cache_hits == 1024
    with pytest.raises(PolicyError, match="must divide"):
        b.add("c", 100, 1, 2.0, block_ids=[1], block_tokens=20)


def conversations(n: int, turns: int, gap_s: float) -> list[TraceRequest]:
    """``n`` conversations of ``turns`` turns, each turn's prompt the last one plus two
    blocks, sharing a one-block system prompt (block 0), interleaved in time."""
    out = []
    for turn in range(turns):
        for c in range(n):
            blocks = (0, *(1000 * c + j + 1 for j in range(2 * turn + 2)))
            t = turn * gap_s + c * gap_s / n
            prompt = 512 * len(blocks) + 40
            out.append(TraceRequest(t, prompt, 200, block_hashes=blocks, block_tokens=512))
    return out


def hit_rate(routing: str, router: str = "least_loaded") -> float:
    prof = load_profile("llama3-8b-h100").with_overrides(
        enable_prefix_caching=True, max_model_len=16384
    )
    policy = PolicyConfig.model_validate({"pools": [{"name": "default", "routing": routing}]})
    res = run_simulation(policy, conversations(12, 4, 2.0), 4, prof, router=router)
    assert set(res.records.state.tolist()) == {"completed"}
    return res.pools[0].prefix_hit_rate


def test_routing_on_the_hashes_keeps_conversations_on_warm_engines() -> None:
    least = hit_rate("least_loaded")
    affinity = hit_rate("prefix_affinity")
    hashed = hit_rate("prefix_hash")
    oracle = hit_rate("least_loaded", router="prefix_oracle")
    # every later turn finds its earlier turns' blocks where affinity sent them
    assert affinity > 0.6 and least < 0.5
    assert hashed > 0.6
    assert oracle >= affinity - 0.02


def test_simulate_replays_a_mooncake_file_with_prefix_caching(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "m.jsonl", [{**r, "timestamp": 100 * i} for i, r in enumerate(LINES * 4)]
    )
    out = tmp_path / "out"
    args = ["simulate", "--trace", str(trace), "--replicas", "2", "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "prefix caching on" in res.output and "report:" in res.output
