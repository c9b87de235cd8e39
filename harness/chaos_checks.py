"""The chaos run's invariants, each counted from what the run recorded.

* ``status_500``: answers with status 500, or a stream ended by an error event with code
  ``internal_error`` (the gateway's 500 once a stream began).  Other 5xx are legitimate
  outcomes of faults (503 ``draining``, ``state_unavailable``, ``no_healthy_upstream``,
  502 ``upstream_error`` when an engine dies under a request): counted in a detail line.
* ``unfinished``: requests without exactly one terminal outcome: on the client's side
  (:mod:`harness.chaos_load`: ``broken``, ``timeout``, ``pending``); on the gateways'
  (work still queued or in flight once the run settled); and terminal outcomes counted by
  the gateways (``velvetrope_requests_total``) outside what the clients sent: at least
  every request that got a status line, at most every request sent.
* ``leaked_slots``: leases in Redis still live once every gateway was idle and one lease
  TTL had passed, plus leases the gateways still say they hold (``/admin/status``).
* ``unsettled_reservations``: holds (reservations awaiting settlement) in Redis once every gateway
  was idle with an empty outbox (nobody would settle them: only ``hold_ttl_s`` would remove
  them), plus buckets not back to full once their own refill time had passed.
* ``settle_mismatch``: tokens, see :func:`settlement`.
* ``inflight_over_limit``: requests that took the deployment over ``max_in_flight``, counted
  at the engines, see :func:`inflight`.
* ``priority_inversions``: batch requests dispatched ahead of a queued interactive one of
  the same gateway process, see :func:`priority`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

from harness.chaos_deployment import TOKENIZER
from harness.chaos_load import Shot, request_body
from harness.chaos_state import JournalEntry
from velvetrope.gateway.api.parse import parse_request
from velvetrope.openai.tokenizer import get_tokenizer

__all__ = [
    "COUNTERS",
    "Verdict",
    "gateway_prompt_tokens",
    "inflight",
    "ledger",
    "outcomes",
    "priority",
    "settlement",
    "statuses",
]

COUNTERS = (
    "status_500",
    "unfinished",
    "leaked_slots",
    "unsettled_reservations",
    "settle_mismatch",
    "inflight_over_limit",
    "priority_inversions",
    "ledger_mismatch",
)


@dataclass
class Verdict:
    """One policy's counters, the lines that explain them, and harness problems (anything
    that kept a check from being made: it fails the run too)."""

    policy: str
    requests: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    details: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, counter: str, n: int, detail: str | None = None) -> None:
        self.counts[counter] += n
        if detail is not None:
            self.details.append(f"{counter}: {detail}")

    @property
    def ok(self) -> bool:
        return not self.problems and not any(self.counts.values())

    def line(self) -> str:
        counts = " ".join(f"{k}={self.counts[k]}" for k in COUNTERS)
        return f"chaos: policy={self.policy} requests={self.requests} {counts}"


@cache
def gateway_prompt_tokens(prompt: int) -> int:
    """The prompt tokens the gateway charges for :data:`~harness.chaos_load.PROMPTS`
    ``[prompt]``: its own parsing of such a body, with the tokenizer the run configures
    (:data:`~harness.chaos_deployment.TOKENIZER`)."""
    tok = get_tokenizer(TOKENIZER)
    parsed = parse_request(
        request_body(prompt, 1, False, "probe"),
        "chat",
        max_tokens_limit=32768,
        count_text=tok.count,
        count_chat=tok.count_chat,
    )
    return parsed.prompt_tokens


# -- statuses and outcomes -------------------------------------------------------------------


def statuses(shots: Sequence[Shot], v: Verdict) -> None:
    """``status_500``, and the other answers by status and code (a detail line)."""
    seen: Counter[str] = Counter()
    fives = 0
    for s in shots:
        if s.status is None:
            continue
        key = f"{s.status}" + (f"/{s.code}" if s.code else "")
        if s.status == 200 and s.code:
            key = f"200+event/{s.code}"
        if s.outcome == "hung_up":
            key += "(then hung up)"
        seen[key] += 1
        if s.status == 500 or s.code == "internal_error":
            fives += 1
    v.add("status_500", fives)
    v.details.append("answers: " + ", ".join(f"{k}={n}" for k, n in sorted(seen.items())))


def outcomes(
    shots: Sequence[Shot], gateway_outcomes: float, residue: dict[str, int], v: Verdict
) -> None:
    """``unfinished`` (see the module docstring); ``gateway_outcomes`` is the sum of
    ``velvetrope_requests_total`` over every gateway process, ``residue`` per gateway the
    work it still had queued or in flight at the end."""
    kinds = Counter(s.outcome for s in shots if s.sent_at is not None)
    bad = [
        s for s in shots if s.sent_at is not None and s.outcome in ("broken", "timeout", "pending")
    ]
    v.add("unfinished", len(bad))
    v.details.append("client outcomes: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())))
    for s in bad[:5]:
        v.details.append(
            f"unfinished: {s.request_id} via {s.gateway}#{s.incarnation}: {s.outcome} {s.detail}"
        )
    unsent = sum(1 for s in shots if s.sent_at is None)
    if unsent:
        v.problems.append(f"{unsent} requests were never sent (no gateway in rotation)")
    left = sum(residue.values())
    v.add("unfinished", left, f"gateways' work left at the end: {residue}" if left else None)
    lower = sum(1 for s in shots if s.status is not None)
    upper = sum(1 for s in shots if s.sent_at is not None)
    got = int(gateway_outcomes)
    note = f"gateways counted {got} terminal outcomes for {upper} requests sent ({lower} answered)"
    v.details.append(note)
    if got < lower:
        v.add("unfinished", lower - got, f"{lower - got} answered requests have no outcome")
    elif got > upper:
        v.add("unfinished", got - upper, f"{got - upper} outcomes more than requests sent")


# -- settlement ------------------------------------------------------------------------------


def _bounds(shot: Shot, entries: Sequence[JournalEntry]) -> tuple[int, int]:
    """What the gateway settles for ``shot`` (tokens of its token bucket): exactly known,
    or, where only a bound is known, ``(lo, hi)`` (see :func:`settlement`)."""
    p = gateway_prompt_tokens(shot.prompt)
    most = p + shot.max_tokens
    if shot.usage is not None:  # the engine's usage reached the client, so the gateway too
        u = shot.usage[0] + shot.usage[1]
        return u, u
    if shot.outcome == "hung_up":
        if not entries:  # queued, or dispatched and cancelled before the engine had it
            return 0, p
        if any(e.end is None for e in entries) or not shot.stream:
            # a killed engine; or a non-streaming answer, whose hang-up is charged the
            # reservation (the engine may go on generating: nothing relayed says how much)
            return p + shot.chunks, most
        return p + shot.chunks, p + max(e.taken for e in entries)
    if shot.outcome != "answered":
        return 0, most  # unfinished: counted there
    if shot.status == 200:
        if shot.code is not None:  # the stream failed: charged what was relayed
            return p + shot.chunks, p + shot.chunks
        return 0, most  # 200 without a usage: cannot be (usage was asked for)
    if shot.status == 502 and shot.code == "upstream_error":
        if shot.message.startswith("upstream answered"):
            return 0, 0  # the engine answered an error: nothing used
        return p, p  # the engine died under it: charged the prompt (usage so far)
    if shot.status == 504:
        return p, p
    return 0, 0  # refused before any work


def settlement(
    shots: Sequence[Shot],
    entries: Sequence[JournalEntry],
    settled: float,
    engine_totals: Sequence[tuple[str, float, int, int]],
    v: Verdict,
) -> None:
    """``settle_mismatch``, in tokens, the sum of four parts:

    1. the gateways' ``velvetrope_tokens_settled_total`` (every process, the drained one's
       read before it exited) outside ``[L, H]``: per request, what the gateway's rules
       charge given what its client saw (:func:`_bounds`).  Exact (``lo == hi``) for every
       request but those whose client hung up after the gateway may have dispatched it: the
       gateway charges the prompt plus the tokens it relayed before it noticed, which lie
       between what the client received and what the engine handed its writer (the
       journal's ``taken``; with no journal end, the engine was killed: ``max_tokens``).
       A request killed with its engine is charged the prompt and what was relayed, which
       its client saw: exact.  ``H - L`` is printed: the only tolerance;
    2. per request whose usage the client saw: that usage against the journal of the engine
       that finished it (prompt prefilled, tokens generated);
    3. per request that reached an engine: the prompt the gateway counts against the one
       the engine counted;
    4. per engine process whose final ``/metrics`` were read (a killed one's died with it:
       its journal stands in): ``vllm:prompt_tokens_total`` and
       ``vllm:generation_tokens_total`` against its journal's sums.
    ``engine_totals``: ``(name, journal-matching metrics sum, prefilled, generated)``."""
    by_rid: dict[str, list[JournalEntry]] = defaultdict(list)
    for e in entries:
        if e.request_id is not None:
            by_rid[e.request_id].append(e)
    lo = hi = 0
    for s in shots:
        if s.sent_at is None:
            continue
        a, b = _bounds(s, by_rid.get(s.request_id, ()))
        lo, hi = lo + a, hi + b
    outside = int(max(0.0, lo - settled, settled - hi))
    v.add("settle_mismatch", outside)
    v.details.append(
        f"settled={settled:.0f} tokens; expected within [{lo}, {hi}] (window {hi - lo}: "
        f"client hang-ups after dispatch); outside by {outside}"
    )
    usage_off = 0
    for s in shots:
        if s.usage is None:
            continue
        done = [e for e in by_rid.get(s.request_id, ()) if e.state == "finished"]
        if not done:
            usage_off += sum(s.usage)
            v.details.append(f"settle_mismatch: {s.request_id}: usage {s.usage} but no journal end")
            continue
        e = done[-1]
        usage_off += abs(s.usage[0] - e.prefilled) + abs(s.usage[1] - e.generated)
    v.add(
        "settle_mismatch", usage_off, f"usage vs journals off by {usage_off}" if usage_off else None
    )
    prompt_off = 0
    rids = {s.request_id: s for s in shots}
    for e in entries:
        shot = rids.get(e.request_id or "")
        if shot is not None:
            prompt_off += abs(gateway_prompt_tokens(shot.prompt) - e.prompt)
    v.add(
        "settle_mismatch", prompt_off, f"prompt counts off by {prompt_off}" if prompt_off else None
    )
    for name, metrics_sum, prefilled, generated in engine_totals:
        off = int(abs(metrics_sum - prefilled - generated))
        v.add(
            "settle_mismatch",
            off,
            f"{name}: /metrics {metrics_sum:.0f} vs journal {prefilled + generated}"
            if off
            else None,
        )


def ledger(totals: dict[str, int] | None, settled: float, v: Verdict) -> None:
    """``ledger_mismatch``, in tokens: the usage ledger's input and output tokens in Redis
    (``totals``, ``None``: not checked, Redis having restarted empty) against the tokens
    the gateways settled (``velvetrope_tokens_settled_total``, which ``settle_mismatch``
    ties to the engines' journals): the ledger is written by every settlement, each once,
    those settled in a gateway's local fallback while Redis was away (fail_open) included,
    sent when Redis answers again."""
    if totals is None:
        v.details.append("ledger: not checked (Redis restarted empty: the ledger with it)")
        return
    counted = totals["input"] + totals["output"]
    expected = round(settled)
    off = abs(counted - expected)
    v.add("ledger_mismatch", off, f"ledger {counted} tokens vs settled {expected}" if off else None)
    v.details.append(
        f"ledger: {totals['requests']} requests, {totals['input']} input + {totals['output']} "
        f"output tokens = settled {settled:.0f}; off by {off}"
    )


# -- concurrency at the engines ----------------------------------------------------------------


def inflight(
    shots: Sequence[Shot],
    entries: Sequence[JournalEntry],
    killed_at: dict[tuple[str, int], float],
    limit: int,
    t0: float,
    v: Verdict,
) -> list[float]:
    """``inflight_over_limit``: requests whose start at an engine took the number held by
    all engines together above ``limit``.  Returns the instants it first went over, per
    excursion.

    Exact from the journals, on the one clock every process shares: each request counts
    from its start to its end at its engine (:mod:`velvetrope.engine.serve.journal`), with
    two corrections, both toward counting less and both causal: a request held by an engine
    killed with SIGKILL counts until the instant before the signal (no gateway can have
    given its slot back before the engine died), and one whose client hung up counts until
    the hang-up (the gateway may give its slot back any time after, and the engine learns
    of it only when it reads the closed connection).  At equal instants ends count first."""
    hung = {s.request_id: s.hung_up_at for s in shots if s.hung_up_at is not None}
    via = {s.request_id: f"{s.gateway}#{s.incarnation}" for s in shots}
    points: list[tuple[float, int, str]] = []
    open_ends = 0
    for e in entries:
        end = e.end if e.end is not None else killed_at.get((e.engine, e.incarnation))
        if end is None:
            open_ends += 1
            continue
        h = hung.get(e.request_id or "")
        if h is not None:
            end = min(end, h)
        if end <= e.start:
            continue
        points.append((e.start, 1, e.request_id or e.id))
        points.append((end, -1, e.request_id or e.id))
    if open_ends:
        v.problems.append(f"{open_ends} journal entries of live engines never ended")
    points.sort(key=lambda p: (p[0], p[1]))
    peak = over = 0
    live: set[str] = set()
    above_since: float | None = None
    above_s = 0.0
    windows: list[str] = []
    starts: list[float] = []
    for t, d, rid in points:
        if d > 0:
            live.add(rid)
        else:
            live.discard(rid)
        peak = max(peak, len(live))
        if d > 0 and len(live) > limit:
            over += 1
            if above_since is None:
                above_since = t
                starts.append(t)
                if len(windows) < 6:  # who held them when it first went over: by gateway
                    by = Counter(via.get(r, "?") for r in live)
                    windows.append(f"{t - t0:.2f}s ({dict(sorted(by.items()))})")
        if len(live) <= limit and above_since is not None:
            above_s += t - above_since
            above_since = None
    v.add("inflight_over_limit", over)
    where = f"; first over at {', '.join(windows)}" if windows else ""
    v.details.append(
        f"engines held at most {peak} requests at once (limit {limit}); above it for "
        f"{above_s * 1000:.0f} ms{where}"
    )
    return starts


# -- priority -----------------------------------------------------------------------------------


def priority(shots: Sequence[Shot], v: Verdict) -> None:
    """``priority_inversions``: within one gateway process (one pool; the process that
    answered, by the pid in its header), a batch request B
    that arrived while an interactive request I was queued (``a_I < a_B < d_I``) and was
    dispatched before it (``d_B < d_I``), from the gateways' timing headers (arrival and
    dispatch on the gateway's clock, arrival order by its sequence number).  The queue runs
    strict bands with no share for ``batch``, so the policy allows no such B: there is no
    aging or SJF across bands.  Each B counts once.  Requests without a timing header (not
    answered 200) are not compared; two dispatches at the same instant (one pass of the
    queue, which pops in policy order) are not compared either (counted in ``ties``).
    Also checks that every 200 answer has the header, and that each is consistent with the
    client's clock (sent <= arrived <= dispatched <= response head): that the clocks are
    one."""
    groups: dict[tuple[str, int], list[Shot]] = defaultdict(list)  # (gateway, its pid)
    clock_bad = untimed = 0
    for s in shots:
        if s.timing is None:
            untimed += s.status == 200
            continue
        a, d, _, pid = s.timing
        sent, head = s.sent_at, s.head_at
        if sent is None or head is None or not (sent <= a <= d <= head):
            clock_bad += 1
        groups[(s.gateway, pid)].append(s)
    if clock_bad:
        v.problems.append(f"{clock_bad} timing headers disagree with the client's clock")
    if untimed:
        v.problems.append(f"{untimed} 200 answers without a timing header: priority unchecked")
    inversions = exposed = ties = 0
    examples: list[str] = []
    for (gw, pid), group in sorted(groups.items()):
        group.sort(key=lambda s: s.timing[2] if s.timing else 0)
        latest: Shot | None = None  # the interactive one dispatched last, arrived so far
        for s in group:
            assert s.timing is not None
            a, d, _, _ = s.timing
            if s.tier == "interactive":
                if latest is None or latest.timing is None or latest.timing[1] < d:
                    latest = s
                continue
            if latest is None or latest.timing is None:
                continue
            d_i = latest.timing[1]
            if d_i > a:
                exposed += 1
            if d_i > d:
                inversions += 1
                if len(examples) < 3:
                    ai, di, si, _ = latest.timing
                    examples.append(
                        f"{s.request_id} (seq {s.timing[2]}, arrived {a:.3f}, dispatched {d:.3f}) "
                        f"ahead of {latest.request_id} (seq {si}, arrived {ai:.3f}, "
                        f"dispatched {di:.3f}) on {gw} pid {pid}"
                    )
            elif d_i == d and d_i > a:
                ties += 1
    v.add("priority_inversions", inversions)
    v.details.append(
        f"priority: {exposed} batch requests arrived while an interactive one was queued; "
        f"{inversions} dispatched ahead of it, {ties} at the same instant"
        + (f" (e.g. {'; '.join(examples)})" if examples else "")
    )
