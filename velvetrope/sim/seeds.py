"""Seeds: what every random draw of the simulator's workloads takes.

Passing an ``int`` gives a fresh, reproducible stream; passing a
:class:`numpy.random.Generator` shares (and advances) the caller's.  A bad seed raises
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np

from velvetrope.errors import PolicyError

__all__ = ["Seed", "as_generator"]

Seed: TypeAlias = int | np.random.Generator
"""A seed for :func:`numpy.random.default_rng`, or a generator to draw from (and advance)."""


def as_generator(seed: Seed) -> np.random.Generator:
    """Return ``seed`` itself if it is a generator, else ``numpy.random.default_rng(seed)``.

    Passing a generator shares its stream (the caller's generator advances); passing an int
    gives a fresh, reproducible stream.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PolicyError(f"seed must be an int or a numpy Generator, got {seed!r}")
    if seed < 0:
        raise PolicyError(f"seed must be >= 0, got {seed}")
    return np.random.default_rng(seed)
