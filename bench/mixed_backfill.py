"""An embedding backfill on a chat pool, in the simulator: what strict bands are worth.

The workload and policy of ``tests/sim/test_mixed_endpoints_sim.py``: 60 s of interactive
chat (3/s, TTFT objective 1 s) on one ``llama3-8b-a100`` engine with, from t=10 s, a batch
tenant's backfill of 4,000 embedding calls of 200-1,500 tokens in 20 s.  Run with strict
bands (the tiers ordered) and with one band for all; printed per run: the chats that
started within their objective, the slowest chat's TTFT, how the other chats ended, and the
backfill's calls served and their p90 wait.

Run: ``.venv/bin/python bench/mixed_backfill.py`` (a few seconds).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sim.test_mixed_endpoints_sim import TTFT_S, mixed_trace, run_mixed  # noqa: E402


def main() -> None:
    for bands in ("strict", "single"):
        rec = run_mixed(mixed_trace(7), bands=bands).records
        chat, emb = rec.endpoint == "chat", rec.endpoint == "embeddings"
        ttft = rec.ttft()[chat]
        met = int(np.sum(rec.completed[chat] & (ttft <= TTFT_S)))
        ended = Counter(zip(rec.state[chat].tolist(), rec.reason[chat].tolist(), strict=True))
        print(
            f"bands={bands}: chats within {TTFT_S:g} s {met}/{int(chat.sum())}, "
            f"slowest TTFT {float(np.nanmax(ttft)):.2f} s, chats ended {dict(ended)}; "
            f"backfill served {int(rec.completed[emb].sum())}/{int(emb.sum())}, "
            f"p90 wait {float(np.percentile(rec.queue_wait()[emb], 90)):.0f} s"
        )


if __name__ == "__main__":
    main()
