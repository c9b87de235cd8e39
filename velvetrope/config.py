"""The gateway's configuration file: one YAML document, validated with pydantic.

The same file drives ``velvetrope serve`` and ``velvetrope simulate``: the ``policy``
section is the admission core's :class:`~velvetrope.core.policy.PolicyConfig` verbatim,
``quotas`` is :class:`~velvetrope.core.quota_config.QuotaSettings`, and the other sections'
models are :mod:`velvetrope.config_sections`'s; this module holds the whole file's model
(:class:`GatewayConfig`), the API keys and the loading.  Every model forbids unknown keys.
:func:`load_config` reports a bad file as a :class:`~velvetrope.errors.ConfigError` naming
the file, the field and the reason.

Environment overrides: ``VELVETROPE__<SECTION>__<FIELD>=value`` replaces a field before
validation (values are parsed as YAML scalars), e.g. ``VELVETROPE__LISTEN__PORT=9000`` or
``VELVETROPE__ADMIN_TOKEN=...``.  ``admin_token`` may also be given as ``admin_token_env``,
the name of an environment variable that holds it.

Routing rules live in ``policy.routes`` and the saturation rule's parameters in
``policy.saturation`` (the simulator reads them too).  The older spellings are refused with
the new place named (top-level ``routes``) or moved there (``gateway.saturation``, refused
when ``policy.saturation`` is set too: one setting, two places, no guessing which wins).

API keys are stored hashed: ``sha256`` is the hex SHA-256 of the key a client sends as
``Authorization: Bearer <key>``.  ``velvetrope config hash-key KEY`` prints it.  A plain
``key`` is accepted for local examples and tests only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from velvetrope.config_sections import (
    AutoscaleSettings,
    GatewaySettings,
    Listen,
    StateSettings,
    Upstream,
)
from velvetrope.core.policy import PolicyConfig
from velvetrope.core.quota_config import QuotaSettings, check_downgrades
from velvetrope.yaml_config import parse_yaml, read_text, validate

__all__ = [
    "ApiKey",
    "GatewayConfig",
    "gateway_json_schema",
    "hash_key",
    "load_config",
    "parse_config",
]

ENV_PREFIX = "VELVETROPE__"
_WHAT = "gateway config"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def hash_key(key: str) -> str:
    """The hex SHA-256 of an API key, as stored in the config."""
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKey(_Model):
    """One API key and the tenant it authenticates."""

    tenant: str = Field(min_length=1, description="the tenant (policy.tenants[].name) it maps to")
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the key"
    )
    key: str | None = Field(None, min_length=8, description="plain key: examples and tests only")

    @model_validator(mode="after")
    def _one_form(self) -> ApiKey:
        if (self.sha256 is None) == (self.key is None):
            raise ValueError("give exactly one of 'sha256' and 'key'")
        return self

    @property
    def digest(self) -> str:
        return self.sha256 if self.sha256 is not None else hash_key(self.key or "")


class GatewayConfig(_Model):
    """The whole gateway configuration."""

    listen: Listen = Field(default_factory=Listen)
    admin_token: str | None = Field(None, min_length=8, description="bearer token for /admin")
    admin_token_env: str | None = Field(None, description="env var holding the admin token")
    api_keys: tuple[ApiKey, ...] = ()
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    upstreams: dict[str, tuple[Upstream, ...]] = Field(
        default_factory=dict, description="pool name -> its engines"
    )
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    state: StateSettings = Field(default_factory=StateSettings)
    quotas: QuotaSettings = Field(
        default_factory=QuotaSettings,
        description="budgets over days, weeks, months or rolling hours, and the usage ledger",
    )
    autoscale: AutoscaleSettings | None = Field(
        None, description="the engines' KEDA autoscaler, for simulate --autoscale"
    )

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        """Refuse top-level ``routes`` (now ``policy.routes``); move ``gateway.saturation``
        into ``policy.saturation``, and refuse the file that sets both (which of two
        spellings of one setting wins would be a guess; the simulator reads only the
        policy's)."""
        if not isinstance(data, dict):
            return data
        if "routes" in data:
            raise ValueError(
                "routes: routing rules live in policy.routes now "
                "(e.g. {models: [m], pool: p}), so the simulator applies them too"
            )
        gw = data.get("gateway")
        if isinstance(gw, dict) and "saturation" in gw:
            gw = dict(gw)
            sat = gw.pop("saturation")
            policy = dict(data.get("policy") or {})
            if "saturation" in policy:
                raise ValueError(
                    "gateway.saturation and policy.saturation are both set: the saturation "
                    "rule's parameters live in policy.saturation (the simulator reads them "
                    "there too); move gateway.saturation's fields into policy.saturation "
                    "and delete gateway.saturation"
                )
            policy["saturation"] = sat
            data = {**data, "gateway": gw, "policy": policy}
        return data

    @model_validator(mode="after")
    def _check(self) -> GatewayConfig:
        pools = {p.name for p in self.policy.pools}
        if self.autoscale is not None and self.autoscale.pool not in (None, *pools):
            raise ValueError(f"autoscale.pool {self.autoscale.pool!r} is not in policy.pools")
        for name in self.upstreams:
            if name not in pools:
                raise ValueError(f"upstreams names pool {name!r}, not in policy.pools")
        check_downgrades(self.quotas, {t.name for t in self.policy.tiers}, pools)
        digests = [k.digest for k in self.api_keys]
        if len(set(digests)) != len(digests):
            raise ValueError("the same API key is listed twice")
        return self

    def resolved_admin_token(self) -> str | None:
        """The admin token, from the file or from ``admin_token_env``."""
        if self.admin_token is not None:
            return self.admin_token
        if self.admin_token_env is not None:
            return os.environ.get(self.admin_token_env) or None
        return None


def gateway_json_schema() -> str:
    """The JSON Schema (draft 2020-12) of :class:`GatewayConfig`, as ``velvetrope config
    schema`` prints it and ``docs/schema/gateway.schema.json`` holds it: what a file may
    contain, as pydantic validates it (``mode="validation"``), with each field's
    description, for editors (yaml-language-server) and CI."""
    import json

    schema = GatewayConfig.model_json_schema(mode="validation")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "gateway.schema.json",
        "title": "velvetrope gateway config",
        **{k: v for k, v in schema.items() if k != "title"},
    }
    return json.dumps(schema, indent=2, sort_keys=False, ensure_ascii=False)


def _apply_env(data: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = yaml.safe_load(raw)
    return data


def parse_config(
    data: Any, source: str = "<config>", environ: dict[str, str] | None = None
) -> GatewayConfig:
    """Validate an already-parsed document, the environment's overrides applied first (an
    empty document is an empty mapping); a :class:`ConfigError` names ``source`` and the
    fields (:func:`velvetrope.yaml_config.validate`)."""
    if data is None:
        data = {}
    if isinstance(data, dict):
        data = _apply_env(dict(data), dict(os.environ if environ is None else environ))
    return validate(GatewayConfig, data, source, _WHAT)


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> GatewayConfig:
    """Read and validate a YAML config file; :class:`ConfigError` names file and field."""
    p = Path(path)
    return parse_config(parse_yaml(read_text(p, _WHAT), str(p)), str(p), environ)


@dataclass(frozen=True)
class ConfigSource:
    """Where a running gateway's configuration comes from: a file, and the command line's
    ``--host``/``--port`` (which replace ``listen``'s, at start and at every reload)."""

    path: str
    host: str | None = None
    port: int | None = None

    def load(self) -> GatewayConfig:
        """Read and validate the file, with the overrides; ConfigError as
        :func:`load_config`."""
        cfg = load_config(self.path)
        given = {k: v for k, v in (("host", self.host), ("port", self.port)) if v is not None}
        if given:
            cfg = cfg.model_copy(update={"listen": cfg.listen.model_copy(update=given)})
        return cfg
