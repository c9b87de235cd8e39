"""``harness.readme_figures``: the deterministic figures of the README and the docs against
their commands' output (the commands themselves run in ``python -m harness.readme_figures``,
not here)."""

from __future__ import annotations

import re

from harness.readme_figures import CHECKS, README, ROOT, Check, stale, tokens


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


def test_every_checked_key_is_quoted_in_its_page() -> None:
    for check in CHECKS:
        page = check.page.read_text(encoding="utf-8")
        for key in check.keys:
            assert re.search(rf"\b{key}=[0-9.]+", page), f"{key} in {check.page}"


def test_every_checked_page_is_the_readme_or_a_docs_page_on_the_site() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for check in CHECKS:
        assert check.page.is_file(), check.page
        if check.page != README:
            assert check.page.relative_to(ROOT / "docs").as_posix() in nav, check.page
