"""The engine-priority rule: which pools forward a priority, and which."""

from __future__ import annotations

from velvetrope.core import PolicyConfig
from velvetrope.core.engine_priority import EnginePriority


def _config(**pool: object) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {
            "tiers": [{"name": "gold"}, {"name": "silver"}, {"name": "bronze"}],
            "pools": [{"name": "a", **pool}, {"name": "b", "engine_priority": False}],
        }
    )


def test_a_pool_with_engine_priority_forwards_the_tier_index() -> None:
    rule = EnginePriority(_config(engine_priority=True))
    assert rule.enabled
    assert [rule.of("a", t) for t in ("gold", "silver", "bronze")] == [0, 1, 2]
    assert rule.of("b", "gold") is None  # the other pool does not forward
    assert rule.of("a", "unknown") is None


def test_on_by_default() -> None:
    rule = EnginePriority(_config())
    assert rule.table() == {("a", "gold"): 0, ("a", "silver"): 1, ("a", "bronze"): 2}


def test_off_nothing_is_forwarded() -> None:
    rule = EnginePriority(_config(engine_priority=False))
    assert not rule.enabled
    assert rule.of("a", "gold") is None
    assert rule.table() == {}
