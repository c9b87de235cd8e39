"""A mixed trace in the simulator (issue 40): an embedding backfill of a batch tenant lands
on a chat pool; the gateway's own controller, on the engine model, keeps the top tier's
TTFT objective and still serves the whole backfill.  The trace format carries the endpoint
kind, and a prompt-only line is sized as the gateway sizes it (nothing reserved or
predicted for output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.errors import PolicyError, TraceError
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.report import tier_table
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import read_jsonl, write_jsonl

TTFT_S = 1.0
"""The top tier's TTFT objective."""


def mixed_config(bands: str = "strict") -> PolicyConfig:
    return PolicyConfig.model_validate(
        {
            "tiers": [
                {"name": "interactive", "slo": {"ttft_s": TTFT_S}},
                {"name": "batch", "slo": {"e2e_s": 3600}},
            ],
            "tenants": [
                {"name": "gold", "tier": "interactive"},
                {"name": "bronze", "tier": "batch"},
            ],
            "queue": {"bands": bands},
            "pools": [{"name": "default"}],
            "saturation": {"scrape_interval_s": 0.25, "stale_after_s": 3},
        }
    )


def mixed_trace(seed: int) -> list[TraceRequest]:
    """60 s of interactive chat (3/s) with, from t=10 s, a backfill of 4,000 embedding
    calls of 200-1,500 tokens in 20 s (200/s: several times what the engine prefills)."""
    rng = np.random.default_rng(seed)
    chat_t = np.cumsum(rng.exponential(1 / 3.0, 180))
    out = [
        TraceRequest(float(t), int(rng.integers(100, 600)), int(rng.integers(20, 200)), "gold")
        for t in chat_t
    ]
    emb_t = 10.0 + np.sort(rng.uniform(0, 20, 4000))
    out += [
        TraceRequest(float(t), int(rng.integers(200, 1500)), 0, "bronze", endpoint="embeddings")
        for t in emb_t
    ]
    return sorted(out, key=lambda r: r.t)


def run_mixed(reqs: list[TraceRequest], bands: str = "strict") -> Any:
    return run_simulation(mixed_config(bands), reqs, 1, load_profile("llama3-8b-a100"), seed=1)


def test_an_embedding_backfill_on_a_chat_pool_leaves_the_top_tier_its_ttft() -> None:
    result = run_mixed(mixed_trace(7))
    rec = result.records
    chat, emb = rec.endpoint == "chat", rec.endpoint == "embeddings"
    assert int(chat.sum()) == 180 and int(emb.sum()) == 4000
    # the backfill is served, every call of it, as prompt-only work: no output
    assert bool(rec.completed[emb].all())
    assert int(rec.output[emb].sum()) == 0
    assert bool((rec.predicted[emb] == 0).all())
    # it saturated the engine: its calls waited (the top tier did not wait behind them)
    wait = rec.queue_wait()
    assert float(np.percentile(wait[emb], 90)) > 5 * TTFT_S
    ttft = rec.ttft()[chat & rec.completed]
    assert int(chat.sum()) == int((chat & rec.completed).sum())
    assert float(ttft.max()) <= TTFT_S, float(ttft.max())
    assert result.records.endpoint_counts() == {"chat": (180, 180), "embeddings": (4000, 4000)}
    table = tier_table(result)
    assert "by endpoint: chat 180 (180 done), embeddings 4,000 (4,000 done)" in str(table.caption)


def test_without_tiers_the_same_backfill_breaks_the_chats_ttft() -> None:
    """The test above can fail: with one band for every tier (``bands: single``) the chats
    queue behind the backfill, and fewer than 90% of them start within their objective."""
    rec = run_mixed(mixed_trace(7), bands="single").records
    chat = rec.endpoint == "chat"
    ttft = rec.ttft()[chat]
    met = int(np.sum(rec.completed[chat] & (ttft <= TTFT_S)))
    assert met < 0.9 * 180, met


def test_a_trace_line_may_be_an_embedding_call_and_round_trips(tmp_path: Path) -> None:
    reqs = [
        TraceRequest(0.0, 40, 12, "gold"),
        TraceRequest(0.5, 300, 0, "bronze", endpoint="embeddings"),
        TraceRequest(0.7, 90, 0, "bronze", endpoint="rerank", model="reranker"),
    ]
    path = tmp_path / "mixed.jsonl"
    write_jsonl(reqs, path)
    lines = path.read_text().splitlines()
    assert '"endpoint"' not in lines[0]  # chat, the default, is not written
    assert '"endpoint":"embeddings"' in lines[1].replace(" ", "")
    assert read_jsonl(path) == reqs


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ('{"t": 0, "tenant": "b", "prompt_tokens": 9, "output_tokens": 3, '
         '"endpoint": "embeddings"}', "prompt-only: output_tokens must be 0"),
        ('{"t": 0, "tenant": "b", "prompt_tokens": 9, "output_tokens": 0, '
         '"max_tokens": 4, "endpoint": "rerank"}', "prompt-only"),
        ('{"t": 0, "tenant": "b", "prompt_tokens": 9, "output_tokens": 0, '
         '"endpoint": "audio"}', "endpoint must be one of chat, completions"),
        ('{"t": 0, "tenant": "b", "prompt_tokens": 9, "output_tokens": 0, '
         '"endpoint": "passthrough"}', "embeddings, rerank, got 'passthrough'"),
        ('{"t": 0, "tenant": "b", "prompt_tokens": 9, "output_tokens": 0, '
         '"endpoint": 3}', "'endpoint' must be a string"),
    ],
)  # fmt: skip
def test_a_bad_endpoint_line_is_refused_naming_the_line(
    tmp_path: Path, line: str, what: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TraceError, match=rf"bad\.jsonl:1: .*{what}"):
        read_jsonl(path)


def test_a_prompt_only_request_is_checked_when_built() -> None:
    with pytest.raises(PolicyError, match="prompt-only"):
        TraceRequest(0.0, 10, 5, "b", endpoint="embeddings")


def test_shadow_decisions_of_a_mixed_run_are_reported_by_endpoint() -> None:
    cfg = mixed_config().model_dump()
    cfg["tiers"][1]["enforce"] = False  # the backfill's tier in shadow mode
    result = run_simulation(
        PolicyConfig.model_validate(cfg), mixed_trace(7)[:1500], 1, load_profile("llama3-8b-a100")
    )
    counts = result.records.shadow_counts(by_endpoint=True)
    assert counts and {k[0] for k in counts} == {"batch"}
    assert {k[3] for k in counts} == {"embeddings"}
    assert sum(counts.values()) == int(np.sum(result.records.endpoint == "embeddings"))
    assert sum(result.records.shadow_counts().values()) == sum(counts.values())
    caption = str(tier_table(result).caption)
    assert "shadow (enforce: false, all passed through): batch " in caption
    assert "embeddings" in caption.split("shadow")[1]
