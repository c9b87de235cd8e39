"""The generated configuration pages and the config's JSON Schema: current, complete, and
what editors and ``velvetrope init`` point at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from harness.config_reference import REFERENCE, SCHEMA, _models_in, sections, written
from velvetrope.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gateway.yaml"


@pytest.mark.parametrize("path", [REFERENCE, SCHEMA], ids=lambda p: p.name)
def test_the_committed_page_is_what_make_reference_writes(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == written()[path], (
        f"{path.relative_to(ROOT)} is stale: run `make reference` and commit it"
    )


def test_every_field_of_every_section_is_in_the_reference_with_a_description() -> None:
    page = REFERENCE.read_text(encoding="utf-8")
    undescribed = []
    for section in sections():
        assert f"{{#{section.anchor}}}" in page, section.model.__name__
        for name, info in section.model.model_fields.items():
            assert f"| `{name}` |" in page, f"{section.title}.{name}"
            if not info.description and not _models_in(info.annotation):
                undescribed.append(f"{section.model.__name__}.{name}")
    assert not undescribed, f"give these fields a Field(description=...): {undescribed}"


def test_config_schema_prints_the_committed_schema() -> None:
    out = CliRunner().invoke(app, ["config", "schema"])
    assert out.exit_code == 0, out.output
    assert out.output == SCHEMA.read_text(encoding="utf-8")


def _schema_errors(data: Any) -> list[tuple[list[str | int], str]]:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    return [(list(e.absolute_path), e.message) for e in validator.iter_errors(data)]


def test_the_example_config_is_valid_and_a_misplaced_key_is_named() -> None:
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert _schema_errors(data) == []
    data["redis"] = {"url": "redis://r:6379/0"}  # the chart's old key, in the wrong file
    data["policy"]["pools"][0]["max_inflight"] = 3  # a typo
    errors = _schema_errors(data)
    assert ([], "Additional properties are not allowed ('redis' was unexpected)") in errors
    assert (
        ["policy", "pools", 0],
        "Additional properties are not allowed ('max_inflight' was unexpected)",
    ) in errors


def test_the_example_points_editors_at_the_schema() -> None:
    first = EXAMPLE.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema="), first
    target = first.partition("$schema=")[2]
    assert (EXAMPLE.parent / target).resolve() == SCHEMA.resolve()
