"""The Helm chart rendered offline for a matrix of values, and what a cluster would check.

Rendering is Helm's own (``helm-python-sdk``, :mod:`harness.chart`), for every value set of
:data:`harness.chart.VALUE_SETS`; then:

* every object validates against the strict Kubernetes schemas of 1.28, 1.30 and 1.33, or
  the vendored KEDA / Prometheus Operator CRDs (and so do ``deploy/keda``'s files); the
  validators catch a planted mistake;
* the chart refuses what it must (:data:`harness.chart.REFUSED`);
* every pod meets the restricted Pod Security Standard and mounts no API token;
* the state URL follows the documented precedence (``config.state.url``, else the in-chart
  Redis, else ``memory://``); the in-chart Redis requires the very Secret the gateway reads,
  only this release's gateway pods may reach it, and it has probes, limits and ``maxmemory``;
* the rendered gateway config is valid for ``velvetrope.config``;
* the PrometheusRule carries the configured labels (kube-prometheus-stack's ``release`` by
  default), every velvetrope selector is scoped to the release, and ``promtool`` checks the
  rules and passes ``deploy/prometheus/alerts.test.yaml`` (each alert fires and stays quiet
  where it should; NotReady fires with the in-chart Redis up); a planted regression fails it.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.chart import REFUSED, VALUE_SETS, Rendered, render, render_error, validate
from harness.chart_schema import SCHEMA, values_schema
from velvetrope.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yaml"
KEDA_FILES = sorted((ROOT / "deploy" / "keda").glob("*.yaml"))


@pytest.fixture(scope="module")
def rendered() -> dict[str, Rendered]:
    return {name: render(values, name) for name, values in VALUE_SETS.items()}


def _pods(r: Rendered) -> list[dict[str, Any]]:
    return [d["spec"]["template"] for d in r.kind("Deployment")]


def _config(r: Rendered) -> dict[str, Any]:
    (cm,) = r.kind("ConfigMap")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["gateway.yaml"])
    return cfg


def _gateway(r: Rendered) -> dict[str, Any]:
    (dep,) = [d for d in r.kind("Deployment") if not d["metadata"]["name"].endswith("-redis")]
    return dep


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in container.get("env", [])}


# --------------------------------------------------------------------------- schemas


def test_at_least_six_value_sets_render(rendered: dict[str, Rendered]) -> None:
    assert len(rendered) >= 6
    for r in rendered.values():
        assert {"Deployment", "Service", "ConfigMap"} <= {o["kind"] for o in r.objects}, r.name


def test_every_object_passes_kubernetes_and_crd_schemas(rendered: dict[str, Rendered]) -> None:
    lines = [
        f"{r.name}: {line}" for r in rendered.values() for o in r.objects for line in validate(o)
    ]
    for path in KEDA_FILES:
        lines += [f"{path.name}: {line}" for line in validate(yaml.safe_load(path.read_text()))]
    failures = [line for line in lines if not line.split(": ", 1)[1].startswith("ok ")]
    assert not failures, "\n".join(failures)
    assert len(lines) > 100
    for kind in ("PrometheusRule", "ServiceMonitor", "ScaledObject"):
        assert any(f"ok {kind}/" in line and "vs CRD" in line for line in lines), kind


def test_the_validators_catch_planted_mistakes(rendered: dict[str, Rendered]) -> None:
    r = copy.deepcopy(rendered["monitoring"])  # the fixture is shared: plant in a copy

    def fails(obj: dict[str, Any]) -> bool:
        return any(line.startswith("FAIL") for line in validate(obj))

    dep = _gateway(r)
    dep["spec"]["replica"] = 2  # misspelt field: strict schemas refuse it
    assert fails(dep)
    (rule,) = r.kind("PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = 10  # a duration is a string
    assert fails(rule)
    (monitor,) = r.kind("ServiceMonitor")
    monitor["spec"]["endpoint"] = []  # not a field of the CRD
    assert fails(monitor)
    so = yaml.safe_load((ROOT / "deploy" / "keda" / "scaledobject.yaml").read_text())
    so["spec"]["minReplicaCount"] = "two"
    assert fails(so)
    assert fails({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_chart_refuses(case: str) -> None:
    values, phrase = REFUSED[case]
    assert phrase in render_error(values)


# --------------------------------------------------------------------------- pods


def test_every_pod_meets_the_restricted_profile(rendered: dict[str, Rendered]) -> None:
    for r in rendered.values():
        for pod in _pods(r):
            spec = pod["spec"]
            where = f"{r.name}: {pod['metadata']['labels']['app.kubernetes.io/name']}"
            assert spec["automountServiceAccountToken"] is False, where
            psc = spec["securityContext"]
            assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0, where
            assert psc["seccompProfile"]["type"] == "RuntimeDefault", where
            for c in spec["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False, where
                assert sc["capabilities"]["drop"] == ["ALL"], where
                assert sc["readOnlyRootFilesystem"] is True, where
                assert "limits" in c["resources"] and "memory" in c["resources"]["limits"]
                assert "livenessProbe" in c and "readinessProbe" in c, where
            assert not any("hostPath" in v for v in spec.get("volumes", [])), where


# --------------------------------------------------------------------------- state


def test_the_state_url_follows_the_documented_precedence(rendered: dict[str, Rendered]) -> None:
    cases = {
        "defaults": ("redis://velvetrope-redis:6379/0", True, 2),
        "external-redis-wins": ("redis://redis-master.data.svc:6379/2", False, 2),
        "external-redis-only": ("redis://redis-master.data.svc:6379/2", False, 3),
        "single-memory": (None, False, None),
        "expected-replicas-given": ("redis://velvetrope-redis:6379/0", True, 6),
    }
    for name, (url, in_chart, expected) in cases.items():
        r = rendered[name]
        state = _config(r)["state"]
        assert state.get("url") == url, name
        assert bool(r.kind("Deployment", "velvetrope-redis")) is in_chart, name
        assert state.get("expected_replicas") == expected, name
        env = _env(_gateway(r)["spec"]["template"]["spec"]["containers"][0])
        assert ("VELVETROPE_REDIS_PASSWORD" in env) is (url is not None), name
        assert (state.get("password_env") == "VELVETROPE_REDIS_PASSWORD") is (url is not None)


def test_redis_requires_the_secret_the_gateway_reads(rendered: dict[str, Rendered]) -> None:
    r = rendered["defaults"]
    redis = r.one("Deployment", "velvetrope-redis")["spec"]["template"]["spec"]
    (container,) = redis["containers"]
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert args[args.index("--maxmemory") + 1] == "200mb"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    secret = _env(container)["REDIS_PASSWORD"]["secretKeyRef"]
    assert secret == {"name": "velvetrope-redis", "key": "password"}
    assert _env(container)["REDISCLI_AUTH"]["secretKeyRef"] == secret  # the probe's auth
    gateway = _env(_gateway(r)["spec"]["template"]["spec"]["containers"][0])
    assert gateway["VELVETROPE_REDIS_PASSWORD"]["secretKeyRef"] == secret
    assert "redis-cli" in " ".join(container["readinessProbe"]["exec"]["command"])
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi") and int(limit[:-2]) > 200, "maxmemory below the limit"


def test_only_the_releases_gateways_reach_redis(rendered: dict[str, Rendered]) -> None:
    r = rendered["defaults"]
    (policy,) = r.kind("NetworkPolicy")
    redis_labels = r.one("Deployment", "velvetrope-redis")["spec"]["template"]["metadata"]
    gateway_labels = _gateway(r)["spec"]["template"]["metadata"]["labels"]
    selects = policy["spec"]["podSelector"]["matchLabels"]
    assert selects.items() <= redis_labels["labels"].items()
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    allowed = peer["podSelector"]["matchLabels"]
    assert allowed.items() <= gateway_labels.items()
    assert not allowed.items() <= redis_labels["labels"].items()
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    service = r.one("Service", "velvetrope")["spec"]["selector"]
    assert not service.items() <= redis_labels["labels"].items(), "gateway Service selects Redis"
    (pdb,) = [p for p in r.kind("PodDisruptionBudget") if p["metadata"]["name"].endswith("redis")]
    assert pdb["spec"]["selector"]["matchLabels"] == selects
    assert not rendered["redis-unguarded"].kind("NetworkPolicy")


def test_rendered_configs_are_valid_gateway_configs(rendered: dict[str, Rendered]) -> None:
    env = {"VELVETROPE_ADMIN_TOKEN": "t" * 32, "VELVETROPE_REDIS_PASSWORD": "p" * 16}
    for r in rendered.values():
        cfg = parse_config(_config(r), f"{r.name} ConfigMap", environ=env)
        assert cfg.state.url.startswith("memory://" if r.name == "single-memory" else "redis://")


# --------------------------------------------------------------------------- alerts


def test_the_prometheus_rule_is_labelled_and_scoped(rendered: dict[str, Rendered]) -> None:
    assert not rendered["defaults"].kind("PrometheusRule")
    (rule,) = rendered["monitoring"].kind("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    (default_rule,) = rendered["expected-replicas-given"].kind("PrometheusRule")
    assert default_rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (renamed,) = rendered["renamed-no-admin"].kind("PrometheusRule")
    for r, job in ((rule, "velvetrope"), (renamed, "door")):
        for group in r["spec"]["groups"]:
            for alert in group["rules"]:
                expr = alert["expr"]
                assert "__" not in expr and "pod=~" not in expr, alert["alert"]
                for sel in re.findall(r"velvetrope_\w+(\{[^}]*\})?", expr):
                    assert f'namespace="llm", job="{job}"' in sel, (alert["alert"], expr)
                if "kube_" in expr:
                    assert f'deployment="{job}"' in expr, alert["alert"]
    top = rule["spec"]["groups"][0]["rules"][0]
    assert 'tier="interactive"' in top["expr"] and "> 1\n" in top["expr"]


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).with_name("promtool")  # where `make install` puts it
    promtool = str(beside) if beside.exists() else shutil.which("promtool")
    assert promtool, "no promtool: `make install` installs it (from Debian's prometheus)"
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _write_rules(spec: dict[str, Any], directory: Path) -> None:
    (directory / "alerts.full.yaml").write_text(yaml.safe_dump(spec))
    bare = yaml.safe_load(yaml.safe_dump(spec))
    for group in bare["groups"]:
        for alert in group["rules"]:
            alert.pop("annotations", None)
    (directory / "alerts.rules.yaml").write_text(yaml.safe_dump(bare))
    shutil.copy(ALERT_TESTS, directory / "alerts.test.yaml")


def test_promtool_checks_the_rules_and_passes_their_unit_tests(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    (rule,) = rendered["monitoring"].kind("PrometheusRule")
    _write_rules(rule["spec"], tmp_path)
    check = _promtool("check", "rules", "alerts.full.yaml", cwd=tmp_path)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    unit = _promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS.read_text()))
    alerts = {a["alert"] for g in rule["spec"]["groups"] for a in g["rules"]}
    assert tested == alerts, f"alerts without a unit test: {alerts - tested}"


def test_promtool_fails_the_old_notready_matcher(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    """A pod-name pattern that also matches the in-chart Redis keeps NotReady quiet: the
    unit tests catch it."""
    (rule,) = rendered["monitoring"].kind("PrometheusRule")
    spec = yaml.safe_load(yaml.safe_dump(rule["spec"]))
    for group in spec["groups"]:
        for alert in group["rules"]:
            alert["expr"] = alert["expr"].replace(
                'deployment="velvetrope"', 'deployment=~".*velvetrope.*"'
            )
    _write_rules(spec, tmp_path)
    unit = _promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert unit.returncode != 0 and "VelvetropeNotReady" in unit.stdout + unit.stderr


# --------------------------------------------------------------------------- values schema


def test_the_values_schema_is_what_make_reference_writes() -> None:
    assert SCHEMA.read_text(encoding="utf-8") == values_schema(), (
        "deploy/helm/velvetrope/values.schema.json is stale: run `make reference`"
    )


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"redis": {"url": "redis://r:6379/0"}}, "at '/redis': additional properties 'url'"),
        ({"replica_count": 3}, "additional properties 'replica_count' not allowed"),
        ({"config": {"state": {"uri": "redis://r"}}}, "at '/config/state': additional prop"),
        ({"config": {"policy": {"pools": [{"name": "d", "max_inflight": 4}]}}}, "'max_inflight'"),
        ({"replicaCount": "3"}, "at '/replicaCount': got string, want integer"),
    ],
)
def test_helm_refuses_unknown_or_moved_keys_and_names_them(
    values: dict[str, Any], named: str
) -> None:
    error = render_error(values)
    assert "values don't meet the specifications of the schema" in error, error
    assert named in error, error


def test_the_schema_leaves_kubernetes_objects_free_and_keeps_the_state_url() -> None:
    r = render(
        {
            "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": 0}},
            "podAnnotations": {"a/b": "c"},
            "config": {"state": {"url": "redis://r:6379/0"}},
        }
    )
    assert _config(r)["state"]["url"] == "redis://r:6379/0"
