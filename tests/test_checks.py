"""Numbers passed in code: what :mod:`velvetrope.checks` accepts, and the errors it names."""

from __future__ import annotations

import math

import numpy as np
import pytest

from velvetrope import checks
from velvetrope.errors import PolicyError


def test_number_is_a_finite_float_above_its_bound() -> None:
    assert checks.number("rate", 2) == 2.0 and isinstance(checks.number("rate", 2), float)
    assert checks.number("rate", np.float64(0.5)) == 0.5
    assert checks.number("start", 0, strict=False) == 0.0
    assert checks.number("x", 1.5, minimum=1.0) == 1.5
    with pytest.raises(PolicyError, match=r"^rate must be finite and > 0, got 0$"):
        checks.number("rate", 0)
    with pytest.raises(PolicyError, match=r"^start must be finite and >= 0, got -1$"):
        checks.number("start", -1, strict=False)
    with pytest.raises(PolicyError, match=r"^x must be finite and > 1, got 1.0$"):
        checks.number("x", 1.0, minimum=1.0)
    for bad in (math.nan, math.inf):
        with pytest.raises(PolicyError, match="must be finite"):
            checks.number("rate", bad, strict=False)
    for wrong in (True, "1", None):
        with pytest.raises(PolicyError, match=f"^rate must be a number, got {wrong!r}$"):
            checks.number("rate", wrong)


def test_count_is_an_int_at_least_its_minimum() -> None:
    assert checks.count("n", 0) == 0
    n = checks.count("n", np.int64(3), 1)
    assert n == 3 and type(n) is int
    with pytest.raises(PolicyError, match=r"^n must be >= 1, got 0$"):
        checks.count("n", 0, 1)
    for bad in (True, 2.0, "2", None):
        with pytest.raises(PolicyError, match=f"^n must be an integer, got {bad!r}$"):
            checks.count("n", bad)
