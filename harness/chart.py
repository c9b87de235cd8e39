"""The Helm chart rendered offline, and its objects checked against the schemas a cluster
would apply.

Rendering uses Helm's own Go SDK through ``helm-python-sdk`` (a shared library bundled in
the wheel, no ``helm`` binary, no cluster): exactly ``helm template``.  Every rendered object
is validated against

* the Kubernetes JSON schemas of :data:`KUBERNETES_VERSIONS` (the ``kubernetes-validate``
  package's strict variants: an unknown field is an error, as ``kubectl apply
  --validate=strict`` makes it), for the built-in kinds;
* the vendored CustomResourceDefinitions of ``tests/data/crds/`` (KEDA's ScaledObject,
  the Prometheus Operator's PrometheusRule and ServiceMonitor; see the README there) for
  theirs, made strict the same way: an object schema that lists its properties and does not
  say ``x-kubernetes-preserve-unknown-fields`` accepts no other.

:data:`VALUE_SETS` is the matrix of values the test suite and ``bench/deploy_bench.py``
render; :data:`REFUSED` the values the chart must refuse to render, with the reason.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

__all__ = [
    "CHART",
    "CRDS",
    "KUBERNETES_VERSIONS",
    "REFUSED",
    "VALUE_SETS",
    "Rendered",
    "crd_schema",
    "render",
    "render_error",
    "validate",
]

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "velvetrope"
CRDS = ROOT / "tests" / "data" / "crds"
KUBERNETES_VERSIONS = ("1.28.0", "1.30.0", "1.33.0")
"""The API versions every built-in object is validated against (oldest supported to new)."""
RELEASE = "velvetrope"
NAMESPACE = "llm"

_EXTERNAL = {"config": {"state": {"url": "redis://redis-master.data.svc:6379/2"}}}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kps", "team": "llm"}},
    },
    "external-redis-wins": _EXTERNAL,  # redis.enabled stays true: the URL takes precedence
    "external-redis-only": {
        **_EXTERNAL,
        "replicaCount": 3,
        "redis": {"enabled": False, "passwordSecret": "ext-redis"},
    },
    "single-memory": {
        "replicaCount": 1,
        "redis": {"enabled": False, "passwordSecret": ""},
        "podDisruptionBudget": {"enabled": False},
    },
    "redis-unguarded": {
        "redis": {"networkPolicy": {"enabled": False}, "podDisruptionBudget": {"enabled": False}},
        "topologySpread": {"enabled": False},
    },
    "renamed-no-admin": {
        "fullnameOverride": "door",
        "adminToken": {"existingSecret": ""},
        "prometheusRule": {"enabled": True},
        "serviceMonitor": {"enabled": True},
    },
    "expected-replicas-given": {
        "replicaCount": 4,
        "config": {"state": {"expected_replicas": 6, "on_store_error": "fail_closed"}},
        "prometheusRule": {"enabled": True},
    },
}
"""Name -> values (merged over values.yaml by Helm), each rendered as release ``velvetrope``
in namespace ``llm``."""

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "replicas-without-state": (
        {"redis": {"enabled": False}},
        "replicaCount > 1 needs shared state",
    ),
    "replicas-on-memory": (
        {"config": {"state": {"url": "memory://"}}},
        "replicaCount > 1 needs shared state",
    ),
    "redis-without-password": (
        {"redis": {"passwordSecret": ""}},
        "the in-chart Redis needs a password",
    ),
    "grace-too-short": ({"terminationGracePeriodSeconds": 30}, "must exceed"),
    # a token the config's schema accepts (values.schema.json): the chart's own rule refuses it
    "admin-token-in-values": (
        {"config": {"admin_token": "a-long-admin-token"}},
        "config.admin_token must not be set in values",
    ),
    # null removes the key (an empty list is refused earlier, by values.schema.json)
    "rules-without-tiers": (
        {"prometheusRule": {"enabled": True}, "config": {"policy": {"tiers": None}}},
        "prometheusRule needs config.policy.tiers",
    ),
}
"""Name -> (values, a phrase of the error) the chart must fail to render."""


@dataclass
class Rendered:
    """One rendering: the manifests by template path, and every object in them."""

    name: str
    manifests: dict[str, str]
    objects: list[dict[str, Any]]

    def kind(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        """The objects of ``kind`` (and ``metadata.name``, if given)."""
        return [
            o
            for o in self.objects
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
        ]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        (obj,) = self.kind(kind, name)
        return obj


def render(values: Mapping[str, Any], name: str = "values", release: str = RELEASE) -> Rendered:
    """``helm template RELEASE deploy/helm/velvetrope -n llm`` with ``values``."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(copy.deepcopy(dict(values)), name=release, namespace=NAMESPACE)
    objects = [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return Rendered(name, manifests, objects)


def render_error(values: Mapping[str, Any]) -> str:
    """The error of rendering ``values`` (AssertionError if it renders)."""
    try:
        render(values)
    except helm.HelmError as exc:
        return str(exc)
    raise AssertionError(f"rendered, but should have been refused: {values}")


def _strict(schema: Any) -> Any:
    """A copy of an OpenAPI v3 CRD schema where an object that lists its properties and does
    not preserve unknown fields rejects others (the API server's strict field validation)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _crds() -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                api = f"{group}/{version['name']}"
                out[(api, kind)] = _strict(version["schema"]["openAPIV3Schema"])
    return out


def crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    """The strict schema of a vendored CRD's kind at ``api_version``; None if not vendored."""
    return _crds().get((api_version, kind))


def validate(obj: Mapping[str, Any]) -> Iterator[str]:
    """Validate one object; yields a line per check, ``"ok ..."`` or ``"FAIL ..."``: one
    per Kubernetes version for a built-in kind, one against its CRD for a custom kind."""
    api, kind = obj["apiVersion"], obj["kind"]
    what = f"{kind}/{obj.get('metadata', {}).get('name', '?')}"
    schema = crd_schema(api, kind)
    if schema is not None:
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=str)
        detail = "; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:3])
        yield f"FAIL {what} vs CRD {api}: {detail}" if errors else f"ok {what} vs CRD {api}"
        return
    group = api.rpartition("/")[0]
    if "." in group and not group.endswith(".k8s.io"):  # a custom resource: needs its CRD
        yield f"FAIL {what}: no vendored CRD for {api} {kind}"
        return
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(dict(obj), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            yield f"FAIL {what} vs Kubernetes {version}: {exc}"
        except kubernetes_validate.SchemaNotFoundError:
            yield f"FAIL {what}: no Kubernetes {version} schema for {api} {kind}"
        else:
            yield f"ok {what} vs Kubernetes {version}"
