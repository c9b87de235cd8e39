"""Start-up delays and one pool's replicas: which go first, what they cost."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from velvetrope.errors import PolicyError
from velvetrope.sim.replicas import ReplicaPool, ReplicaState, StartupDelay


def _pool(delay: str = "100") -> ReplicaPool:
    slots = itertools.count()
    return ReplicaPool(StartupDelay.parse(delay), np.random.default_rng(0), lambda: next(slots))


class TestStartupDelay:
    def test_forms(self) -> None:
        rng = np.random.default_rng(1)
        assert StartupDelay.parse("120").draw(rng) == 120.0
        u = StartupDelay.parse("90-180")
        draws = [u.draw(rng) for _ in range(2000)]
        assert min(draws) >= 90 and max(draws) <= 180
        assert np.mean(draws) == pytest.approx(135, abs=3)
        ln = StartupDelay.parse("lognormal:120:0.3")
        assert np.median([ln.draw(rng) for _ in range(4001)]) == pytest.approx(120, rel=0.05)
        assert str(u) == "uniform 90-180 s"

    @pytest.mark.parametrize("text", ["", "abc", "180-90", "lognormal:0:1", "-5", "1-2-3"])
    def test_bad(self, text: str) -> None:
        with pytest.raises(PolicyError):
            StartupDelay.parse(text)


class TestReplicaPool:
    def test_scale_up_then_ready_after_the_delay(self) -> None:
        pool = _pool("100")
        pool.add_ready(0.0, 2)
        started, drained = pool.scale(10.0, 5)
        assert [r.slot for r in started] == [2, 3, 4] and drained == []
        assert [r.ready_at for r in started] == [110.0] * 3
        assert (pool.asked, pool.ready) == (5, 2)
        assert pool.become_ready(started[0], 110.0)
        assert (pool.asked, pool.ready) == (5, 3)
        assert pool.samples == [(0.0, 2, 2), (10.0, 5, 2), (110.0, 5, 3)]

    def test_scale_down_takes_starting_newest_first_then_most_recently_ready(self) -> None:
        pool = _pool("100")
        pool.add_ready(0.0, 2)  # slots 0, 1 ready at 0
        a, _ = pool.scale(10.0, 3)  # slot 2
        pool.become_ready(a[0], 110.0)
        pool.scale(120.0, 5)  # slots 3 and 4, starting
        c, _ = pool.scale(130.0, 6)  # slot 5, starting (newest)
        pool.scale(135.0, 5)
        assert [r.slot for r in pool.replicas if r.state is ReplicaState.GONE] == [5]
        started, drained = pool.scale(140.0, 2)
        assert started == []
        gone = [r.slot for r in pool.replicas if r.state is ReplicaState.GONE]
        assert sorted(gone) == [3, 4, 5]  # every starting replica, at once
        assert [r.slot for r in drained] == [2]  # then the most recently ready
        assert not pool.become_ready(c[0], 230.0)  # scaled away before it was ready
        assert (pool.asked, pool.ready) == (2, 2)
        pool.leave(drained[0], 150.0)
        with pytest.raises(PolicyError):
            pool.leave(drained[0], 151.0)

    def test_gpu_time_runs_from_ask_to_gone(self) -> None:
        pool = _pool("100")
        pool.add_ready(0.0, 1)
        (r,), _ = pool.scale(50.0, 2)
        pool.become_ready(r, 150.0)
        _, (d,) = pool.scale(200.0, 1)
        pool.leave(d, 260.0)  # drained for 60 s
        # replica 0: 0..300; replica 1: 50..260 (start-up and drain included)
        assert pool.gpu_seconds(300.0) == pytest.approx(300.0 + 210.0)
        with pytest.raises(PolicyError):
            pool.scale(1.0, -1)
