"""``python -m harness.soak`` end to end, briefly: real Redis, engines and gateway, the command
line's outputs (the CSV, the PNG, the verdict line) and its exit status."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from harness.soak_probe import COLUMNS, SERIES
from harness.soak_report import VERDICT_RE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.alone  # its verdict counts client hang-ups and leftovers: no other load beside it
def test_a_short_soak_samples_every_series_and_ends_clean(tmp_path: Path) -> None:
    args = ["--seconds", "6", "--sample-s", "0.5", "--rate", "15", "--out", str(tmp_path)]
    run = subprocess.run(
        [sys.executable, "-m", "harness.soak", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = run.stdout.strip().splitlines()
    assert lines, run.stderr
    m = VERDICT_RE.match(lines[-1])
    assert m is not None, run.stdout + run.stderr
    assert float(m["hours"]) == pytest.approx(6 / 3600, rel=0.2)
    # every request ended, and nothing was left held in the gateway or in Redis
    assert m["errors"] == "0", run.stdout
    assert run.returncode == (0 if m["verdict"] == "flat" else 1), run.stdout
    with (tmp_path / "soak.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert len(rows) >= 8  # 13 due; some may be lost to a slow start on a busy machine
    for name in SERIES:
        assert all(float(r[name]) > 0 for r in rows), name  # each read at every sample
    assert max(float(r["tasks"]) for r in rows[1:]) > float(rows[0]["tasks"])  # requests count
    assert int(rows[-1]["sent"]) > 0 and int(rows[-1]["hung_up"]) > 0
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in SERIES:  # a line per judged series, before the verdict
        assert any(ln.startswith(f"soak: {name}: slope ") for ln in lines), name
