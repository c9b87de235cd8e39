"""Scenarios whose results are pinned byte for byte (``test_loop_golden``).

Each scenario is a :func:`~velvetrope.sim.loop.run_simulation` call exercising a part of the
loop: queueing, shedding, bucket limits, engine refusals, preemption, client timeouts (some
arriving at the same instant), deadlines, load rescaling, noisy predictions, prefix caching.

A run is pinned twice.  :func:`digest` hashes everything a run returns; the test's
``GOLDEN`` digests were printed by the simulator's loop before the event environment
replaced it, so they prove the two decide alike.  :func:`records` spells the same run out,
one line per record (each decision, each request's row, each sample, each engine scrape,
the span and the pools' stats, with the arrays' dtypes), floats by ``repr`` (which
round-trips exactly); the lines are stored in ``tests/sim/goldens/<scenario>.txt.gz``, so a
run that differs is reported by its first differing record: its index, the line expected
and the line got.

Regenerate both after a change that is meant to change decisions::

    .venv/bin/python -m tests.sim.golden --write            # every scenario
    .venv/bin/python -m tests.sim.golden --write conv-overload

It writes the records files and prints the digests to paste into ``GOLDEN`` in
``tests/sim/test_loop_golden.py``; commit both.  Without ``--write`` it only prints the
digests of the code on the path.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tests.sim.test_loop import SMALL
from tests.sim.test_loop import STRESS_POLICY as STRESS
from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.sim.arrivals import Poisson
from velvetrope.sim.inputs import default_policy, prepare_workload
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.prefixes import with_system_prompts
from velvetrope.sim.result import SimResult
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest

H100 = load_profile("llama3-8b-h100")
MIX = TenantMix.parse("gold:interactive:0.2,silver:standard:0.3,bronze:batch:0.5")


def _stress(
    n: int = 400, rate: float = 30.0, seed: int = 3, dup: bool = False
) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    times = Poisson(rate).times(seed, count=n)
    if dup:  # groups of three at one instant: their client timeouts fall together too
        times = np.repeat(times[::3], 3)[:n]
    out = []
    for i, t in enumerate(times.tolist()):
        prompt = int(rng.integers(20, 900))
        output = int(rng.integers(0, 300))
        if i == 1:
            prompt = 2040
        out.append(TraceRequest(t, prompt, output, "abc"[i % 3], None, max(output, 1) + 50))
    return out


def _conv() -> SimResult:
    work = prepare_workload("azure_conv", tenants=MIX, seed=1, limit=700)
    return run_simulation(
        default_policy(MIX, 2), work, 2, H100, load=1.3, lengths="noisy:0.5",
        client_timeout_s=20.0, seed=1, record_decisions=True,
    )  # fmt: skip


def _prefix() -> SimResult:
    work = with_system_prompts(prepare_workload("azure_code", tenants=MIX, limit=500), 800)
    prof = H100.with_overrides(enable_prefix_caching=True)
    return run_simulation(
        default_policy(MIX, 1, "fifo"), work, 1, prof, load=1.1, record_decisions=True
    )


def _least_loaded() -> SimResult:
    work = _stress()
    return run_simulation(
        STRESS, work, 2, SMALL, lengths="oracle", client_timeout_s=4.0, record_decisions=True
    )


def _round_robin() -> SimResult:
    work = _stress()
    return run_simulation(STRESS, work, 2, SMALL, router="round_robin", record_decisions=True)


def _same_instant() -> SimResult:
    work = _stress(dup=True, rate=60.0)
    return run_simulation(STRESS, work, 3, SMALL, client_timeout_s=2.5, record_decisions=True)


ROUTED = PolicyConfig.model_validate(
    {
        "preset": "priority",
        "queue": {"max_queued": 60},
        "tiers": [
            {
                "name": "gold",
                "max_wait_s": 2.0,
                "degrade": {"wait_s": 0.5, "max_tokens": 64, "pool": "short"},
            },
            {"name": "bronze", "max_wait_s": 6.0},
        ],
        "tenants": [
            {"name": "a", "tier": "gold"},
            {"name": "b", "tier": "bronze"},
            {"name": "c", "tier": "bronze"},
        ],
        "pools": [
            {"name": "long", "max_in_flight_per_engine": 6},
            {"name": "short", "max_in_flight_per_engine": 5},
        ],
        "routes": [{"name": "short-answers", "pool": "short", "max_predicted_output": 120}],
    }
)


def _routed() -> SimResult:
    work = _stress(n=500, rate=40.0, seed=5)
    return run_simulation(
        ROUTED, work, {"long": 2, "short": 1}, SMALL, lengths="oracle", client_timeout_s=5.0,
        record_decisions=True, record_engines=True,
    )  # fmt: skip


SCENARIOS: dict[str, Callable[[], SimResult]] = {
    "stress-least-loaded": _least_loaded,
    "stress-round-robin": _round_robin,
    "stress-same-instant": _same_instant,
    "conv-overload": _conv,
    "code-prefix": _prefix,
    "routes-degrade-engines": _routed,
}


def digest(res: SimResult) -> str:
    """SHA-256 over the decision log, every per-request array, the span, the pools' stats
    and the samples."""
    h = hashlib.sha256()
    h.update(repr(res.decisions).encode())
    for f in dataclasses.fields(res.records):
        value = getattr(res.records, f.name)
        if value is None:  # an optional column the run did not fill adds nothing
            continue
        h.update(f.name.encode())
        h.update(np.ascontiguousarray(value).tobytes())
    h.update(repr(res.span_s).encode())
    h.update(repr(res.pools).encode())
    for a in res.samples:
        h.update(np.ascontiguousarray(a).tobytes())
    engines = getattr(res, "engines", None)
    if engines is not None:
        for f in dataclasses.fields(engines):
            h.update(np.ascontiguousarray(getattr(engines, f.name)).tobytes())
    return h.hexdigest()[:40]


GOLDENS = Path(__file__).resolve().parent / "goldens"
"""Where each scenario's records are stored, one gzipped text file per scenario."""


def _fields(obj: Any) -> list[tuple[str, Any]]:
    return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]


def _dtypes(what: str, columns: Sequence[tuple[str, Any]]) -> str:
    """The dtypes (and shapes) of ``columns``: they are part of the digest's bytes (an
    optional column the run did not fill, ``None``, is left out, as from the digest)."""
    return f"{what}: " + " ".join(
        f"{n}={a.dtype.str}{list(a.shape)}" for n, a in columns if a is not None
    )


def _rows(what: str, columns: Sequence[tuple[str, Any]]) -> list[str]:
    """``what i: name=value ...`` for each row of aligned ``columns`` (None ones skipped)."""
    present = [(n, a.tolist()) for n, a in columns if a is not None]
    if not present:
        return []
    return [
        f"{what} {i}: " + " ".join(f"{n}={v[i]!r}" for n, v in present)
        for i in range(len(present[0][1]))
    ]


def records(res: SimResult) -> list[str]:
    """Everything :func:`digest` hashes, one record per line, in the order: the arrays'
    dtypes, the decision log, the requests' rows, the samples, the engine scrapes, the span,
    the pools.  Two runs have equal lines exactly when their values are equal, floats
    bit for bit (``repr`` round-trips; ``-0.0`` is kept)."""
    req = _fields(res.records)
    samples = list(zip(("t", "queued", "in_flight"), res.samples, strict=True))
    engines = _fields(res.engines) if getattr(res, "engines", None) is not None else []
    out = [_dtypes("requests", req), _dtypes("samples", samples)]
    if engines:
        out.append(_dtypes("engines", engines))
    if res.decisions is None:
        out.append("decisions: None")
    else:
        out += [f"decision {i}: {d!r}" for i, d in enumerate(res.decisions)]
    out += _rows("request", req)
    out += _rows("sample", samples)
    out += _rows("scrape", engines)
    out.append(f"span_s: {res.span_s!r}")
    out += [f"pool {i}: {p!r}" for i, p in enumerate(res.pools)]
    return out


def path(name: str) -> Path:
    return GOLDENS / f"{name}.txt.gz"


def stored(name: str) -> list[str] | None:
    """The records stored for scenario ``name`` (None: none stored)."""
    p = path(name)
    if not p.exists():
        return None
    return gzip.decompress(p.read_bytes()).decode("utf-8").splitlines()


def store(name: str, lines: list[str]) -> None:
    """Write the records of scenario ``name`` (byte for byte the same for the same lines)."""
    GOLDENS.mkdir(exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path(name).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))


def first_difference(expected: list[str], got: list[str]) -> str | None:
    """None if the two runs' records are equal, else a report of the first that differs:
    its index, the line expected and the line got (and how many differ in all)."""
    n = max(len(expected), len(got))
    differ = [i for i in range(n) if i >= len(expected) or i >= len(got) or expected[i] != got[i]]
    if not differ:
        return None
    i = differ[0]
    want = expected[i] if i < len(expected) else "(no such record: the run is longer)"
    have = got[i] if i < len(got) else "(no such record: the run is shorter)"
    fields = _changed_fields(want, have)
    return (
        f"record {i} differs (the first of {len(differ)} of {n} that do; "
        f"{len(expected)} expected, {len(got)} got):\n"
        f"  expected: {want}\n"
        f"  got:      {have}" + (f"\n  changed:  {fields}" if fields else "")
    )


def _pairs(line: str) -> list[tuple[str, str]] | None:
    """``name=value`` items of a row line (values are reprs: a space inside quotes or
    brackets does not split), or None if it is not a row."""
    _, sep, rest = line.partition(": ")
    if not sep:
        return None
    items, start, depth, quote, escaped = [], 0, 0, "", False
    for k, ch in enumerate(rest + " "):
        if escaped:
            escaped = False
        elif quote:
            escaped = ch == "\\"
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == " " and depth == 0:
            items.append(rest[start:k])
            start = k + 1
    pairs = [item.partition("=") for item in items]
    if not all(eq and name.isidentifier() for name, eq, _ in pairs):
        return None
    return [(name, value) for name, _, value in pairs]


def _changed_fields(want: str, have: str) -> str:
    """``name: expected -> got`` for each field two row lines disagree on ('' if they are
    not rows of the same fields)."""
    a, b = _pairs(want), _pairs(have)
    if a is None or b is None or [n for n, _ in a] != [n for n, _ in b]:
        return ""
    return ", ".join(f"{n}: {x} -> {y}" for (n, x), (_, y) in zip(a, b, strict=True) if x != y)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.sim.golden", description=__doc__)
    ap.add_argument("names", nargs="*", help="scenarios (default: all)")
    ap.add_argument("--write", action="store_true", help="store the runs' records")
    args = ap.parse_args(argv)
    unknown = set(args.names) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios {sorted(unknown)}; known: {sorted(SCENARIOS)}")
    for name in args.names or SCENARIOS:
        res = SCENARIOS[name]()
        if args.write:
            store(name, records(res))
        print(f'    "{name}": "{digest(res)}",')


if __name__ == "__main__":
    main()
