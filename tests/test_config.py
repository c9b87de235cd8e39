"""The gateway config: validation names file and field; env overrides; the CLI checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.config import hash_key, load_config, parse_config
from velvetrope.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gateway.yaml"


def test_the_example_config_loads() -> None:
    cfg = load_config(EXAMPLE, environ={})
    assert cfg.policy.preset == "hybrid"
    assert [t.tenant for t in cfg.api_keys] == ["acme", "globex", "initech"]
    assert cfg.policy.routes == ()
    assert cfg.resolved_admin_token() == "demo-admin-token"


@pytest.mark.parametrize(
    ("doc", "field", "why"),
    [
        ({"listen": {"port": "eighty"}}, "listen.port", "as an integer (got 'eighty')"),
        ({"bogus": 1}, None, "unknown field 'bogus' (known fields: listen, "),
        ({"listen": {"bogus": 1}}, None, "unknown field 'listen.bogus'"),
        ({"listen": 8080}, "listen", "expected a mapping of fields"),
        ({"api_keys": [{"sha256": "ab" * 32}]}, None, "field 'api_keys.0.tenant': required"),
        (
            {"policy": {"tiers": [{"name": "a"}], "tenants": [{"name": "t", "tier": "b"}]}},
            "policy",
            "unknown tier 'b'",
        ),
        ({"api_keys": [{"tenant": "t"}]}, "api_keys.0", "exactly one of"),
        ({"api_keys": [{"tenant": "t", "sha256": "nothex"}]}, "api_keys.0.sha256", "pattern"),
        (
            {"upstreams": {"nope": [{"url": "http://x"}]}},
            None,
            "config: upstreams names pool 'nope', not in policy.pools",  # the whole file's
        ),
        ({"upstreams": {"default": [{"url": "ftp://x"}]}}, "upstreams.default.0.url", "pattern"),
        ({"gateway": {"max_body_bytes": 10}}, "gateway.max_body_bytes", "greater than"),
        ({"gateway": {"request_timeout_s": 0}}, "gateway.request_timeout_s", "greater than 0"),
        ({"gateway": {"request_timeout_s": float("inf")}}, "gateway.request_timeout_s", "finite"),
    ],
)
def test_a_bad_config_names_the_file_the_field_and_the_reason(
    tmp_path: Path, doc: dict[str, object], field: str | None, why: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as ei:
        load_config(path, environ={})
    msg = str(ei.value)
    assert msg.startswith(f"{path}: invalid gateway config: "), msg
    if field is not None:
        assert f"field {field!r}: " in msg, msg
    assert why in msg, msg


def test_unreadable_or_non_mapping_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=f"^{missing}: gateway config file not found$"):
        load_config(missing)
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"must be a YAML mapping of fields \(listen, .*got list"):
        load_config(p)
    p.write_text("listen: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    p.write_bytes(b"listen: {host: \xff}\n")
    with pytest.raises(ConfigError, match="cannot read gateway config file: 'utf-8' codec"):
        load_config(p)
    p.write_text("")
    assert load_config(p, environ={}) == parse_config({}, environ={})  # empty: all defaults


def test_environment_overrides_replace_fields_before_validation() -> None:
    env = {
        "VELVETROPE__LISTEN__PORT": "9123",
        "VELVETROPE__GATEWAY__TOKENIZER": "cl100k_base",
        "VELVETROPE__ADMIN_TOKEN": "from-the-environment",
        "UNRELATED": "x",
    }
    cfg = parse_config({"listen": {"port": 1}}, environ=env)
    assert cfg.listen.port == 9123
    assert cfg.gateway.tokenizer == "cl100k_base"
    assert cfg.admin_token == "from-the-environment"
    with pytest.raises(ConfigError, match=r"listen\.port"):
        parse_config({}, "x.yaml", environ={"VELVETROPE__LISTEN__PORT": "not-a-port"})


def test_admin_token_from_a_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VR_TEST_ADMIN", "s3cret-token")
    cfg = parse_config({"admin_token_env": "VR_TEST_ADMIN"}, environ={})
    assert cfg.resolved_admin_token() == "s3cret-token"


def test_hashed_keys_authenticate_like_plain_ones() -> None:
    cfg = parse_config(
        {
            "api_keys": [
                {"tenant": "a", "sha256": hash_key("sk-secret-1")},
                {"tenant": "b", "key": "sk-plain-2"},
            ]
        },
        environ={},
    )
    assert [k.digest for k in cfg.api_keys] == [hash_key("sk-secret-1"), hash_key("sk-plain-2")]
    with pytest.raises(ConfigError, match="listed twice"):
        parse_config(
            {
                "api_keys": [
                    {"tenant": "a", "key": "sk-same-key"},
                    {"tenant": "b", "key": "sk-same-key"},
                ]
            },
            environ={},
        )


def test_config_check_and_hash_key_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["config", "check", str(EXAMPLE)])
    assert ok.exit_code == 0, ok.output
    assert "ok:" in ok.output
    assert "tiers=[interactive, standard, batch]" in ok.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: {preset: nope}\n")
    res = runner.invoke(app, ["config", "check", str(bad)])
    assert res.exit_code == 2
    assert "unknown preset 'nope'" in res.output
    res = runner.invoke(app, ["config", "hash-key", "sk-abc"])
    assert res.exit_code == 0
    assert res.output.strip() == hash_key("sk-abc")


def test_config_check_refuses_a_config_no_request_could_pass_unless_a_template(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    res = runner.invoke(app, ["config", "check", str(empty)])
    assert res.exit_code == 2, res.output
    assert "no upstreams" in res.output and "no api_keys" in res.output
    assert "--template" in res.output
    ok = runner.invoke(app, ["config", "check", "--template", str(empty)])
    assert ok.exit_code == 0, ok.output
    assert "upstreams=0" in ok.output
    keys_only = tmp_path / "keys.yaml"
    keys_only.write_text("api_keys: [{tenant: default, key: sk-abcdefgh}]\n")
    res = runner.invoke(app, ["config", "check", str(keys_only)])
    assert res.exit_code == 2
    assert "no upstreams" in res.output and "no api_keys" not in res.output
