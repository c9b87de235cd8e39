"""``velvetrope init``: the example config, its schema and the ScaledObject, written where
the user asked, with a header that names that path."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from harness.config_reference import SCHEMA
from velvetrope.cli import app


def test_init_writes_a_config_that_names_itself_and_its_schema(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["init", str(tmp_path / "conf")])
    assert out.exit_code == 0, out.output
    written_as = str(tmp_path / "conf" / "gateway.yaml")
    text = (tmp_path / "conf" / "gateway.yaml").read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=gateway.schema.json"
    assert f"velvetrope config check {written_as}" in text
    assert "examples/gateway.yaml" not in text
    schema = (tmp_path / "conf" / "gateway.schema.json").read_text()
    assert schema == SCHEMA.read_text(encoding="utf-8")
    assert "add upstreams and api_keys first" not in out.output  # the example has both
    assert out.output.splitlines()[-1].endswith(f"then: velvetrope config check {written_as}")
    check = CliRunner().invoke(app, ["config", "check", written_as])
    assert check.exit_code == 0 and check.output.startswith("ok: "), check.output
