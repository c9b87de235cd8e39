"""A length predictor that uses what a gateway sees of a request.

The core's per-tenant estimator (:class:`~velvetrope.core.estimate.QuantileEstimator`)
gives every request of a tenant nearly the same guess, so it cannot order them.  A gateway
sees more than the tenant: the prompt's *template* (a fingerprint of its system prompt or
first message's prefix: requests of one application look alike, and a classifier, a
summariser and a chat assistant behind one API key answer at very different lengths), the
model, the declared ``max_tokens`` and the prompt's length.  :class:`LengthPredictor`
predicts a conditional quantile of the output length given those, online, in bounded
memory.

Groups, from the most specific down (``mt`` is ``max_tokens`` in powers of two, ``pl`` the
prompt length in powers of two)::

    (tenant, template, model, mt, pl)   prompt length as a feature, within a template
    (tenant, template, model, mt)
    (tenant, template)
    (tenant, model, mt, pl)             no template known (or none seen enough)
    (tenant, model, mt)
    (tenant)
    (everyone)

A job is predicted by the first of its groups (levels without a template are skipped when
the job has none) that holds at least ``min_observations`` outputs: a cold start falls
back to the coarser level, and with nothing at all to the configured default.  Every
finished job is recorded in each of its groups.  A group keeps its last ``window``
outputs (the tenant and global levels keep ``wide_window``) and predicts their
``quantile`` exactly as ``numpy.quantile(..., method="inverted_cdf")`` does: the smallest
observed value with at least that share of the window at or below it, as the window stood
every ``refresh`` observations (by default every eighth of the window, at least 8) and at
each of the first ones (:class:`~velvetrope.core.estimate.WindowQuantile`: sorted only
when the group is read).  At most ``max_keys`` groups live; the least recently used is
dropped first, so a stream of unique templates cannot grow memory past ``max_keys``
windows.  The prediction is clamped to
``[1, max_tokens]``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Final

from velvetrope.core.estimate import OutputEstimator, QuantileEstimator, WindowQuantile
from velvetrope.core.job import Job
from velvetrope.core.policy import EstimatorPolicy

__all__ = ["LengthPredictor", "RingQuantile", "make_estimator"]

_Key = tuple[object, ...]


class RingQuantile(WindowQuantile):
    """The ``p``-quantile of the last ``window`` observations by the inverted CDF (numpy's
    ``method="inverted_cdf"``): the ``⌈p·n⌉``-th smallest; ``nan`` before any.  ``used``
    is when a :class:`LengthPredictor` last touched it (its own tick count)."""

    __slots__ = ("used",)

    def __init__(self, p: float, window: int = 256, refresh: int = 16) -> None:
        super().__init__(p, window, refresh)
        self.used = 0

    def _pick(self, s: list[float]) -> float:
        return s[max(0, math.ceil(self._p * len(s)) - 1)]


class LengthPredictor:
    """Conditional output-length quantiles by tenant, template, model, ``max_tokens`` and
    prompt length (see the module docstring).  An
    :class:`~velvetrope.core.estimate.OutputEstimator`."""

    __slots__ = (
        "_chains",
        "_groups",
        "_min_obs",
        "_ordered",
        "_refresh",
        "_tick",
        "_wide",
        "_window",
        "default",
        "max_keys",
        "prompt_feature",
        "quantile",
    )

    def __init__(
        self,
        quantile: float = 0.9,
        default: int = 256,
        min_observations: int = 8,
        *,
        window: int = 64,
        wide_window: int = 256,
        max_keys: int = 4096,
        prompt_feature: bool = True,
        refresh: int | None = None,
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if min(default, min_observations, window, wide_window, max_keys, refresh or 1) < 1:
            raise ValueError("default, min_observations, windows, max_keys and refresh >= 1")
        self.quantile = quantile
        self.default = default
        self._min_obs = min_observations
        self._window = window
        self._wide = wide_window
        self.max_keys = max_keys
        self.prompt_feature = prompt_feature
        self._refresh = refresh
        # The least recently used group is dropped first.  Until the groups come within
        # _CHAIN_MAX of max_keys none can be dropped, so recency is kept as a tick per group
        # (``used``) and a request shape's groups are reached through its _Chain; from then
        # on (_ordered) the dict's order is the recency order, as the ticks give it.
        self._groups: OrderedDict[_Key, RingQuantile] = OrderedDict()
        self._ordered = False
        self._tick = 0
        # (tenant, template, model, mt, pl) -> its groups, built once (bounded)
        self._chains: dict[_Key, _Chain] = {}

    def __len__(self) -> int:
        """Groups held (at most ``max_keys``)."""
        return len(self._groups)

    def keys(self, job: Job) -> tuple[_Key, ...]:
        """``job``'s groups, most specific first (see the module docstring)."""
        return self._chain_of(job).keys

    def _chain_of(self, job: Job) -> _Chain:
        mt = job.max_tokens.bit_length()
        pl = job.prompt_tokens.bit_length() if self.prompt_feature else -1
        sig = (job.tenant, job.template, job.model, mt, pl)
        chains = self._chains
        out = chains.get(sig)
        if out is None:
            if len(chains) >= self.max_keys:  # a cache, bounded like the groups
                del chains[next(iter(chains))]
            out = chains[sig] = _Chain(self._keys(job.tenant, job.template, job.model, mt, pl))
        return out

    def _keys(self, t: str, tpl: str | None, m: str | None, mt: int, pl: int) -> tuple[_Key, ...]:
        out: list[_Key] = []
        if tpl is not None:
            if self.prompt_feature:
                out.append(("tp", t, tpl, m, mt, pl))
            out += [("tm", t, tpl, m, mt), ("t", t, tpl)]
        if self.prompt_feature:
            out.append(("mp", t, m, mt, pl))
        out += [("m", t, m, mt), ("n", t), ("*",)]
        return tuple(out)

    def predict(self, job: Job) -> int:
        chain = self._chain_of(job)
        guess = self.default
        if self._ordered:
            groups = self._groups
            for key in chain.keys:
                g = groups.get(key)
                if g is not None and g.count >= self._min_obs:
                    groups.move_to_end(key)
                    guess = math.ceil(g.value())
                    break
        else:
            cached = chain.groups
            if cached is None:  # not observed yet: other shapes may share its groups
                groups = self._groups
                cached = [g for g in (groups.get(key) for key in chain.keys) if g is not None]
            for g in cached:
                if g.count >= self._min_obs:
                    g.used = self._tick = self._tick + 1
                    guess = math.ceil(g.value())
                    break
        return max(1, min(job.max_tokens, guess))

    def observe(self, job: Job, output_tokens: int) -> None:
        chain = self._chain_of(job)
        if not self._ordered and len(self._groups) + _CHAIN_MAX > self.max_keys:
            self._order()
        groups = self._groups
        if self._ordered:
            for key in chain.keys:
                g = groups.get(key)
                if g is None:
                    g = groups[key] = self._new(key)
                    if len(groups) > self.max_keys:
                        groups.popitem(last=False)
                else:
                    groups.move_to_end(key)
                g.add(output_tokens)
            return
        cached = chain.groups
        if cached is None:
            cached = chain.groups = []
            for key in chain.keys:
                g = groups.get(key)
                if g is None:
                    g = groups[key] = self._new(key)
                cached.append(g)
        tick = self._tick
        for g in cached:
            tick += 1
            g.used = tick
            g.add(output_tokens)
        self._tick = tick

    def _new(self, key: _Key) -> RingQuantile:
        size = self._wide if key[0] in ("n", "*") else self._window
        every = self._refresh if self._refresh is not None else max(8, size // 8)
        return RingQuantile(self.quantile, size, every)

    def _order(self) -> None:
        """Put the groups in recency order (by their ticks) and keep them so from now on:
        the next groups created may push the least recently used one out."""
        order = sorted(self._groups.items(), key=lambda kv: kv[1].used)
        self._groups = OrderedDict(order)
        self._ordered = True
        self._chains.clear()  # their cached groups may be dropped from now on

    def level(self, job: Job) -> str:
        """Which level would predict ``job`` now (``default`` before any has enough)."""
        for key in self.keys(job):
            g = self._groups.get(key)
            if g is not None and g.count >= self._min_obs:
                return str(key[0])
        return "default"


_CHAIN_MAX: Final = 7
"""Groups per request at most (the levels of the module docstring)."""


class _Chain:
    """One request shape's group keys, most specific first, and (while none can be
    dropped, once the shape was observed) its groups, in the same order."""

    __slots__ = ("groups", "keys")

    def __init__(self, keys: tuple[_Key, ...]) -> None:
        self.keys = keys
        self.groups: list[RingQuantile] | None = None  # all of them, once observed


def make_estimator(policy: EstimatorPolicy) -> OutputEstimator:
    """The output-length estimator ``policy`` describes."""
    if policy.kind == "tenant":
        return QuantileEstimator(
            policy.quantile, policy.default_output_tokens, policy.min_observations, policy.sketch
        )
    return LengthPredictor(
        policy.quantile,
        policy.default_output_tokens,
        policy.min_observations,
        window=policy.window,
        wide_window=4 * policy.window,
        max_keys=policy.max_keys,
        prompt_feature=policy.prompt_feature,
    )
