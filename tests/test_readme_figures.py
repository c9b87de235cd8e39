"""``harness.readme_figures``: the README's deterministic figures against their commands'
output (the commands themselves run in ``python -m harness.readme_figures``, not here)."""

from __future__ import annotations

import re

from harness.readme_figures import CHECKS, README, Check, stale, tokens


def test_tokens_come_from_the_last_result_line() -> None:
    out = "progress 1\nplanner: a=1 b=2.5\nnoise c=3\nplanner: a=4 b=0.186\n"
    assert tokens(out, "planner:") == {"a": "4", "b": "0.186"}
    assert tokens("nothing here\n", "planner:") == {}


def test_a_figure_the_readme_does_not_quote_is_stale() -> None:
    check = Check(("x.py",), "planner:", ("conv_err", "code_err"))
    readme = "low (`code_err=0.186`, `conv_err=0.048`)."
    assert stale(check, "planner: conv_err=0.048 code_err=0.186 other=9\n", readme) == []
    assert stale(check, "planner: conv_err=0.050 code_err=0.186\n", readme) == ["conv_err=0.050"]
    assert stale(check, "crashed\n", readme) == ["conv_err=<missing>", "code_err=<missing>"]


def test_every_checked_key_is_quoted_in_the_readme() -> None:
    readme = README.read_text(encoding="utf-8")
    for check in CHECKS:
        for key in check.keys:
            assert re.search(rf"\b{key}=[0-9.]+", readme), key
