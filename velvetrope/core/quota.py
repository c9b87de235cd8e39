"""Budgets (quotas) and the usage ledger as claims: one reservation path, one settlement.

A budget is a bucket like the rate buckets of :mod:`velvetrope.core.claims`, claimed with
them in the same call to the store and settled with them, exactly once per job, in the
same settlement (memory, or Redis through the same scripts and outbox):

* a calendar budget (``day``, ``week``, ``month`` in the configured time zone) is a bucket
  of the budget's size that never refills (rate 0), keyed by its window
  (``quota:acme:month:2026-12:tok``): the next window is a new key, full;
* a ``rolling`` budget of ``hours`` is a bucket of the budget's size refilled over that
  many hours (at most the budget in a burst, the budget per window on average), keyed
  without a window;
* a job reserves its expected use (``tokens``: the weighted prompt and expected output;
  ``cost_usd``: their price) and settles what it used, weighted or priced from the
  usage the engine reported.  Shadow mode (``enforce: false``) reserves 0, so nothing is
  refused, and settles the same use.

The ledger is four counters per tenant × model × day (``requests``, ``input``, ``cached``,
``output``: ``cached`` the part of ``input`` the engine found in its prefix cache, the
``cached_tokens`` of the job's :class:`~velvetrope.core.lifecycle.Usage`), each a bucket
of capacity 2**53 that never refills, claimed for 0 at admission and settled
at the end with the counts (so the count is ``2**53 - level``, exact below 2**53): the
request's settlement is the ledger's only writer, once per job id.  A job counts on the
day it was admitted (in the time zone), with what it was charged (its usage; nothing for
one refused or shed before it ran), in shadow mode too.  A day counted before the
``cached`` counter existed has none: it reads as 0.

A budget with ``on_exceeded: downgrade`` does not refuse: a job its spent budget denied is
downgraded (:meth:`QuotaBook.exceeded`, :func:`downgrade`: the budget's tier, then the
route's pool for it, or the budget's pool) and reserved again without that budget's claim,
so it is not charged to the spent budget but is to the tenant's others and to the ledger,
settled once like any job.  The gateway and the simulator both apply these two.

Everything takes the wall-clock time as epoch seconds from its caller (sans-IO); keys are
built here and only the ledger's are read back (:func:`ledger_rows`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Final, NamedTuple
from zoneinfo import ZoneInfo

from velvetrope.core.bucket import REQUESTS, TOKENS, BucketSnapshot, Claim, Denial, SettleLine
from velvetrope.core.job import Job
from velvetrope.core.lifecycle import QUOTA_PREFIX, Usage
from velvetrope.core.quota_config import ANY_TENANT, Budget, QuotaSettings

__all__ = [
    "LEDGER_CAP",
    "LEDGER_PREFIX",
    "QUOTA_DOWNGRADE",
    "BudgetBurn",
    "Downgrade",
    "LedgerRow",
    "QuotaBook",
    "budget_key_parts",
    "downgrade",
    "is_ledger_key",
    "ledger_rows",
    "window_bounds",
]

LEDGER_CAP: Final = float(2**53)
"""A ledger counter's capacity: its count is ``LEDGER_CAP - level``, exact below it."""
LEDGER_PREFIX: Final = "ledger|"
_METRICS: Final = ("requests", "input", "cached", "output")
QUOTA_DOWNGRADE: Final = "quota"
"""The ``Job.degraded`` action of a job downgraded by a spent budget."""
_REMEMBER: Final = 65_536


def is_ledger_key(key: str) -> bool:
    """Whether bucket ``key`` is a ledger counter (not a limit to show as a bucket)."""
    return key.startswith(LEDGER_PREFIX)


def window_bounds(window: str, zone: ZoneInfo, epoch: float) -> tuple[str, float, float]:
    """The calendar ``window`` (``day``, ``week``, ``month``) holding ``epoch`` in ``zone``:
    its id (``2026-12-06``, ``2026-W49``, ``2026-12``), start and end (epoch seconds)."""
    d = datetime.fromtimestamp(epoch, zone).date()
    if window == "day":
        first, nxt, wid = d, d + timedelta(days=1), d.isoformat()
    elif window == "week":
        first = d - timedelta(days=d.weekday())
        nxt = first + timedelta(days=7)
        year, week, _ = first.isocalendar()
        wid = f"{year}-W{week:02d}"
    elif window == "month":
        first = d.replace(day=1)
        nxt = date(d.year + d.month // 12, d.month % 12 + 1, 1)
        wid = f"{d.year}-{d.month:02d}"
    else:
        raise ValueError(f"not a calendar window: {window!r}")
    return wid, _midnight(first, zone), _midnight(nxt, zone)


def _midnight(d: date, zone: ZoneInfo) -> float:
    return datetime(d.year, d.month, d.day, tzinfo=zone).timestamp()


class Downgrade(NamedTuple):
    """A job over budget ``key`` (of ``window``) served at ``tier`` and/or in ``pool``
    (``None``: unchanged) instead of refused."""

    key: str
    window: str
    tier: str | None
    pool: str | None

    def describe(self) -> str:
        """``tier=batch; pool=cheap`` (what is given)."""
        parts = [f"tier={self.tier}"] if self.tier is not None else []
        if self.pool is not None:
            parts.append(f"pool={self.pool}")
        return "; ".join(parts)


def downgrade(job: Job, d: Downgrade, route: Callable[[Job], object]) -> None:
    """Downgrade ``job`` as ``d`` says: its tier, then ``route`` (the controller's: the
    pool for the new tier, and any degradation of it), then ``d``'s pool if given; marks
    ``job.degraded`` with :data:`QUOTA_DOWNGRADE` (once).  Call before the job's claims
    are made again (its tier's buckets change with it)."""
    if d.tier is not None:
        job.tier = d.tier
    route(job)
    if d.pool is not None:
        job.pool = d.pool
    if QUOTA_DOWNGRADE not in job.degraded:
        job.degraded = (*job.degraded, QUOTA_DOWNGRADE)


class _Held(NamedTuple):
    """What a quota key counts: its budget, and the end of its window (``None``: rolling)."""

    budget: Budget
    ends_at: float | None


class QuotaBook:
    """The budgets and ledger of one configuration: the claims of a job, the settle lines
    of its end, the reset time of a budget's key.  :meth:`reconfigure` takes a reloaded
    configuration; usage counted so far stays in the store (keys do not change when a
    budget's size or weights do)."""

    def __init__(self, settings: QuotaSettings) -> None:
        self.settings = settings
        self.zone = ZoneInfo(settings.time_zone)
        self._of: dict[tuple[str, str | None], tuple[Budget, ...]] = {}
        self._held: OrderedDict[str, _Held] = OrderedDict()

    def reconfigure(self, settings: QuotaSettings) -> None:
        """Take reloaded ``settings``: sizes, weights and prices apply to jobs admitted from
        now on; a job already admitted settles with its own key's budget as reserved."""
        self.settings = settings
        self.zone = ZoneInfo(settings.time_zone)
        self._of = {}

    @property
    def active(self) -> bool:
        """Whether jobs claim anything here."""
        return self.settings.active

    def budgets(self, tenant: str, model: str | None) -> tuple[Budget, ...]:
        """The budgets a job of ``tenant`` on ``model`` counts against."""
        k = (tenant, model)
        out = self._of.get(k)
        if out is None:
            out = self._of[k] = tuple(
                b
                for b in self.settings.budgets
                if b.tenant in (tenant, ANY_TENANT) and b.model in (None, model)
            )
        return out

    def day(self, epoch: float) -> str:
        """The ledger's day of ``epoch`` (``YYYY-MM-DD`` in the time zone)."""
        return datetime.fromtimestamp(epoch, self.zone).date().isoformat()

    def claims(
        self,
        tenant: str,
        model: str | None,
        prompt: int,
        output: int,
        epoch: float,
        skip: Sequence[str] = (),
    ) -> tuple[Claim, ...]:
        """The claims of a job of ``tenant`` on ``model`` with ``prompt`` tokens and
        ``output`` expected, admitted at ``epoch``: one per budget (its expected use, 0 in
        shadow mode) but those keyed in ``skip`` (spent budgets it was downgraded for),
        then the ledger's counters (0 each)."""
        out: list[Claim] = []
        enforce = self.settings.enforce
        for b in self.budgets(tenant, model):
            key, rate, ends = self._key(b, tenant, epoch)
            if key in skip:
                continue
            self._remember(key, _Held(b, ends))
            amount = self.use(b, model, prompt, 0, output) if enforce else 0.0
            out.append(Claim(key, TOKENS, "quota", amount, b.amount, rate))
        if self.settings.ledger:
            base = f"{LEDGER_PREFIX}{self.day(epoch)}|{tenant}|{model or ''}|"
            for m in _METRICS:
                kind = REQUESTS if m == "requests" else TOKENS
                out.append(Claim(base + m, kind, "ledger", 0.0, LEDGER_CAP, 0.0, 0.0))
        return tuple(out)

    def _key(self, b: Budget, tenant: str, epoch: float) -> tuple[str, float, float | None]:
        """A budget's bucket key for ``tenant`` at ``epoch``, its refill rate and the end
        of its window (``None``: rolling)."""
        scope = tenant if b.model is None else f"{tenant}:{b.model}"
        if b.hours is not None:
            rate = b.amount / (b.hours * 3600.0)
            return f"{QUOTA_PREFIX}{scope}:rolling{b.hours:g}h:{b.unit}", rate, None
        wid, _, end = window_bounds(b.window, self.zone, epoch)
        return f"{QUOTA_PREFIX}{scope}:{b.window}:{wid}:{b.unit}", 0.0, end

    def _remember(self, key: str, held: _Held) -> None:
        known = self._held
        if key in known:
            known.move_to_end(key)
        known[key] = held
        if len(known) > _REMEMBER:
            known.popitem(last=False)

    def use(self, b: Budget, model: str | None, prompt: int, cached: int, output: int) -> float:
        """What ``prompt`` tokens (``cached`` of them cached) and ``output`` count against
        ``b``: weighted tokens, or dollars (0 for a model without a price)."""
        if b.tokens is not None:
            w = b.weights
            return (prompt - cached) * w.input + cached * w.cached_input + output * w.output
        price = self.settings.price(model)
        return 0.0 if price is None else price.cost(prompt, cached, output)

    def settle(
        self,
        model: str | None,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        usage: Usage | None,
    ) -> tuple[SettleLine, ...]:
        """``lines`` (the controller's, one per claim, in order) with each budget's and
        ledger counter's line set from ``usage`` (``None``: the job never ran): a budget
        is charged its weighted or priced use when the controller charged the job at all
        (its line's actual is not 0: a job refused, or refused in shadow mode, is
        refunded), the usage's cached prompt tokens at the budget's ``cached_input``
        weight or price and the rest of the prompt at ``input``'s; a ledger counter the
        job's requests (1 when it used any token), input, cached input and output tokens."""
        out: list[SettleLine] = []
        prompt, output, cached = (0, 0, 0) if usage is None else usage
        for c, line in zip(claims, lines, strict=True):
            owner = c.owner
            if owner == "quota":
                held = self._held.get(c.key)
                used = 0.0
                if held is not None and line[2] > 0.0:
                    used = self.use(held.budget, model, prompt, cached, output)
                elif line[2] > 0.0:  # forgotten (65,536 keys later): its raw tokens
                    used = float(prompt + output)
                line = (c.key, c.amount, used)
            elif owner == "ledger":
                line = (c.key, 0.0, float(_count(c.key, prompt, cached, output)))
            out.append(line)
        return tuple(out)

    def need(self, key: str, model: str | None, prompt: int, output: int) -> float:
        """What a job of ``prompt`` and ``output`` tokens on ``model`` would reserve from
        budget ``key`` when enforced (shadow mode reserves 0); 0 for a key not known."""
        held = self._held.get(key)
        return 0.0 if held is None else self.use(held.budget, model, prompt, 0, output)

    def exceeded(self, denial: Denial) -> Downgrade | None:
        """What a job the store denied gets instead of a refusal: the :class:`Downgrade` of
        the budget that denied it when that budget says ``on_exceeded: downgrade``, else
        ``None`` (refused: a rate bucket, or a budget that refuses)."""
        return self.downgrade_for(denial.key)

    def downgrade_for(self, key: str) -> Downgrade | None:
        """The :class:`Downgrade` of budget ``key`` when spent (``None``: it refuses, or the
        key is not a budget's)."""
        held = self._held.get(key)
        if held is None or held.budget.on_exceeded != "downgrade":
            return None
        b = held.budget
        return Downgrade(key, b.window, b.downgrade_to_tier, b.downgrade_to_pool)

    def window(self, key: str) -> str:
        """The window of budget ``key`` (``day``, ``week``, ``month``, ``rolling``; ``""``
        for a key not known)."""
        held = self._held.get(key)
        return "" if held is None else held.budget.window

    def reset_s(self, key: str, epoch: float) -> float | None:
        """Seconds from ``epoch`` until calendar budget ``key``'s window ends (``None``: not
        a calendar budget's key, or forgotten)."""
        held = self._held.get(key)
        if held is None or held.ends_at is None:
            return None
        return max(0.0, held.ends_at - epoch)

    def burn(
        self, levels: Iterable[tuple[str, tuple[float, float]]], epoch: float
    ) -> list[BudgetBurn]:
        """Each budget in ``levels`` (``(key, (level, capacity))``, other keys skipped) of
        the window holding ``epoch`` (a calendar budget of an earlier window is left out):
        what it used of its limit, and when its window ends, sorted by key."""
        out = []
        for key, (level, capacity) in sorted(levels):
            parts = budget_key_parts(key)
            if parts is None:
                continue
            scope, window, wid, unit = parts
            reset: float | None = None
            if wid is not None:
                now_id, _, end = window_bounds(window, self.zone, epoch)
                if now_id != wid:
                    continue
                reset = max(0.0, end - epoch)
            out.append(BudgetBurn(key, scope, window, unit, capacity - level, capacity, reset))
        return out

    def snapshots(
        self, snaps: tuple[BucketSnapshot, ...], epoch: float
    ) -> tuple[BucketSnapshot, ...]:
        """``snaps`` with each calendar budget's reset time set to its window's end."""
        out = []
        for s in snaps:
            reset = self.reset_s(s.key, epoch) if s.owner == "quota" else None
            out.append(s if reset is None else s._replace(reset_s=reset))
        return tuple(out)


class BudgetBurn(NamedTuple):
    """A budget's burn: its ``key``, ``scope`` (``tenant`` or ``tenant:model``), ``window``
    (``day``, ``week``, ``month`` or ``rolling6h``), ``unit`` (``tok``, ``usd``), what was
    ``used`` of its ``limit``, and the seconds until its window ends (``None``: rolling)."""

    key: str
    scope: str
    window: str
    unit: str
    used: float
    limit: float
    reset_s: float | None


def budget_key_parts(key: str) -> tuple[str, str, str | None, str] | None:
    """A budget's bucket key split: ``(scope, window, window id or None, unit)``
    (``quota:acme:day:2026-12-06:tok`` → ``("acme", "day", "2026-12-06", "tok")``,
    ``quota:acme:rolling6h:tok`` → ``("acme", "rolling6h", None, "tok")``); ``None`` for
    a key that is not a budget's."""
    if not key.startswith(QUOTA_PREFIX):
        return None
    parts = key[len(QUOTA_PREFIX) :].split(":")
    if len(parts) >= 3 and parts[-2].startswith("rolling"):
        return ":".join(parts[:-2]), parts[-2], None, parts[-1]
    if len(parts) >= 4 and parts[-3] in ("day", "week", "month"):
        return ":".join(parts[:-3]), parts[-3], parts[-2], parts[-1]
    return None


def _count(key: str, prompt: int, cached: int, output: int) -> int:
    """A ledger counter's increment for a job that used ``prompt`` (``cached`` of them
    cached) and ``output``."""
    metric = key.rsplit("|", 1)[1]
    if metric == "input":
        return prompt
    if metric == "cached":
        return cached
    if metric == "output":
        return output
    return 1 if prompt + output > 0 else 0


class LedgerRow(NamedTuple):
    """One row of the ledger: a tenant's use of a model on a day.  ``input_tokens`` counts
    every prompt token, ``cached_input_tokens`` the part of them the engines found cached
    (priced at ``cached_input``)."""

    day: str
    tenant: str
    model: str | None
    requests: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    cost_usd: float


def ledger_rows(
    levels: Iterable[tuple[str, float]],
    settings: QuotaSettings,
    first: str | None = None,
    last: str | None = None,
    tenant: str | None = None,
) -> list[LedgerRow]:
    """The ledger's rows from counter ``levels`` (``(key, level)``; other keys skipped),
    days ``first`` to ``last`` (``YYYY-MM-DD``, inclusive; ``None``: unbounded) and one
    ``tenant`` if given, sorted by day, tenant and model.  Cost is priced at read time
    from ``settings.prices`` (0 for a model without a price), the cached input at its
    ``cached_input`` price; a row without a ``cached`` counter (written before it existed)
    has none cached."""
    counts: dict[tuple[str, str, str], dict[str, int]] = {}
    for key, level in levels:
        if not key.startswith(LEDGER_PREFIX):
            continue
        parts = key.split("|")
        if len(parts) < 5:
            continue
        day, model, metric = parts[1], parts[-2], parts[-1]
        who = "|".join(parts[2:-2])
        if (first and day < first) or (last and day > last) or (tenant and who != tenant):
            continue
        row = counts.setdefault((day, who, model), {})
        row[metric] = row.get(metric, 0) + int(LEDGER_CAP - level)
    out = []
    for (day, who, model), c in sorted(counts.items()):
        price = settings.price(model or None)
        inp, cached, outp = c.get("input", 0), c.get("cached", 0), c.get("output", 0)
        cost = 0.0 if price is None else price.cost(inp, cached, outp)
        n = c.get("requests", 0)
        out.append(LedgerRow(day, who, model or None, n, inp, cached, outp, cost))
    return out


def row_dicts(rows: Sequence[LedgerRow]) -> list[Mapping[str, object]]:
    """``rows`` as JSON objects."""
    return [r._asdict() for r in rows]
