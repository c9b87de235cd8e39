"""Reading Prometheus text exposition in tests and harnesses."""

from __future__ import annotations

__all__ = ["metric_sum"]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` in Prometheus ``text`` whose labels include
    ``labels`` (comments and other names, longer ones starting with ``name`` too, skipped)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head != name and not head.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total
