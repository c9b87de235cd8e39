"""Checks of ``deploy/`` against the code it deploys.

A real engine and a real gateway run on loopback; the gateway runs the Helm chart's config
block, started with the Dockerfile's command line, and serves one request so that every
series exists.  Then:

* every YAML and JSON file under ``deploy/`` parses;
* every metric name in any PromQL expression (dashboard, the chart's alerts and their unit
  tests, KEDA)
  is a series of the live exposition: ``velvetrope_*`` from the gateway's ``/metrics``,
  ``vllm:*`` from the engine's.  Names resolve by type: a histogram ``F`` provides
  ``F_bucket`` (with ``le``), ``F_count`` and ``F_sum``, never ``F``; a counter ``F``
  provides ``F_total``;
* every label in a selector, a ``by``/``on`` clause, a legend or an alert annotation exists
  on the metric (or is a target label Prometheus adds); ``reason``/``outcome`` values are
  real reason codes and job states; tier and pool values exist in the chart's config;
* the chart: its config is valid for ``velvetrope.config``, its probe paths answer on the
  live gateway, the grace period outlasts preStop + drain + uvicorn's shutdown, every
  ``.Values`` path a template reads exists;
* the Dockerfile agrees with the chart (port, config path, user).

The config and the alert rules are the chart's own, rendered by Helm
(:func:`harness.chart.render`); ``tests/test_chart.py`` validates the rendered objects and
runs promtool on the rules, ``tests/test_packaging.py`` the image's install line.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.chart import render
from velvetrope.config import parse_config
from velvetrope.core.lifecycle import JobState, Reason
from velvetrope.serving import launch

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "velvetrope"
DOCKERFILE = DEPLOY / "Dockerfile"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yaml"
DASHBOARD = DEPLOY / "grafana" / "velvetrope-dashboard.json"
KEDA = DEPLOY / "keda" / "scaledobject.yaml"

ADMIN_TOKEN = "test-admin-token-deploy"
TEST_KEY = "sk-deploy-test-0000"
# labels Prometheus attaches at scrape time (target labels), not in the exposition
TARGET_LABELS = frozenset({"instance", "job", "namespace", "pod", "service", "container"})
# metrics from other exporters, named on purpose (kube-state-metrics for readiness)
EXTERNAL_METRICS = frozenset(
    {"kube_deployment_status_replicas_available", "kube_deployment_spec_replicas"}
)
REASONS = frozenset(r.code for r in Reason)
STATES = frozenset(s.value for s in JobState)


# --------------------------------------------------------------------------- files


def _yaml_docs(path: Path) -> list[Any]:
    return list(yaml.safe_load_all(path.read_text()))


def _yaml(path: Path) -> Any:
    docs = _yaml_docs(path)
    assert len(docs) == 1, f"{path}: expected one YAML document, got {len(docs)}"
    return docs[0]


def _values() -> dict[str, Any]:
    values: dict[str, Any] = _yaml(CHART / "values.yaml")
    return values


def _chart_config() -> dict[str, Any]:
    """The gateway config the chart renders with its defaults (the ConfigMap's gateway.yaml,
    rendered by Helm: :func:`harness.chart.render`)."""
    (cm,) = render({}).kind("ConfigMap")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["gateway.yaml"])
    return cfg


def _alert_rule() -> dict[str, Any]:
    """The chart's PrometheusRule, rendered with its defaults and prometheusRule.enabled."""
    (rule,) = render({"prometheusRule": {"enabled": True}}).kind("PrometheusRule")
    return rule


def test_several_replicas_share_state() -> None:
    """The chart's defaults run several replicas, so they must render a Redis state.url (and
    the chart refuses several replicas without one: tests/test_chart.py)."""
    values = _values()
    assert values["replicaCount"] > 1
    assert _chart_config()["state"]["url"].startswith("redis://")
    # before Redis ever answers, fail_open shares limits by the chart's replica count
    assert _chart_config()["state"]["expected_replicas"] == values["replicaCount"]


def _dockerfile() -> dict[str, list[str]]:
    """Instruction -> its arguments (one entry per occurrence, continuation lines joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        out.setdefault(instr.upper(), []).append(rest.strip())
    return out


def _docker_cmd() -> list[str]:
    """ENTRYPOINT + CMD of the image, exec form."""
    d = _dockerfile()
    entry: list[str] = json.loads(d["ENTRYPOINT"][-1])
    cmd: list[str] = json.loads(d["CMD"][-1])
    return entry + cmd


def _uvicorn_grace_s() -> float:
    """uvicorn's timeout_graceful_shutdown in velvetrope/gateway/api/server.py (after the drain)."""
    src = (ROOT / "velvetrope" / "gateway" / "api" / "server.py").read_text()
    m = re.search(r"timeout_graceful_shutdown\s*=\s*([0-9.]+)", src)
    assert m, "velvetrope/gateway/api/server.py: timeout_graceful_shutdown not found"
    return float(m.group(1))


# --------------------------------------------------------------------------- PromQL


_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<var>\$\{\w+\}|\$\w+)
  | (?P<num>\d[\w.]*)
  | (?P<ident>[A-Za-z_:][\w:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[{}()\[\],=<>+\-*/%^@])
    """,
    re.VERBOSE,
)
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = frozenset({"bool", "offset", "and", "or", "unless", "atan2", "inf", "nan"})
_BY = (("ident", "by"), ("ident", "without"))
_AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk"}
    | {"quantile", "count_values", "limitk", "limit_ratio"}
)


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # (label, op, value)


@dataclass
class Parsed:
    selectors: list[Selector]
    grouping: set[str]  # labels named in by/without/on/ignoring/group_* clauses
    aggregated: bool  # an aggregation operator appears (its result keeps only `by` labels)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise AssertionError(f"cannot scan PromQL at {expr[pos : pos + 20]!r} in {expr!r}")
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def parse_promql(expr: str) -> Parsed:
    """Metric selectors (name + matchers) and grouping labels of an expression.

    A scanner, not a parser: it knows PromQL's lexical shapes (a name followed by ``(`` is a
    function, ``by``/``on``/... take a label list, ``[...]`` is a range) and fails on any
    token it cannot place, so nothing is skipped silently."""
    toks = _tokens(expr)
    sels: list[Selector] = []
    grouping: set[str] = set()
    aggregated = False
    i = 0
    n = len(toks)

    def nxt(j: int) -> tuple[str, str] | None:
        return toks[j] if j < n else None

    while i < n:
        kind, text = toks[i]
        if kind == "ident" and text in _GROUPING:
            if nxt(i + 1) == ("op", "("):
                j = i + 2
                while toks[j] != ("op", ")"):
                    k, t = toks[j]
                    if k == "ident":
                        grouping.add(t)
                    elif (k, t) != ("op", ","):
                        raise AssertionError(f"unexpected {t!r} in a label list: {expr!r}")
                    j += 1
                i = j + 1
            else:  # group_left without labels
                i += 1
        elif kind == "ident" and text in _KEYWORDS:
            i += 1
        elif kind == "ident" and (nxt(i + 1) == ("op", "(") or nxt(i + 1) in _BY):
            aggregated = aggregated or text in _AGGREGATIONS  # else a function
            i += 1
        elif kind == "ident":
            sel = Selector(text)
            i += 1
            if nxt(i) == ("op", "{"):
                i += 1
                while toks[i] != ("op", "}"):
                    if toks[i] == ("op", ","):
                        i += 1
                        continue
                    (k1, label), (k2, op), (k3, value) = toks[i : i + 3]
                    if k1 != "ident" or k2 != "op" or k3 != "str":
                        raise AssertionError(f"bad matcher near {label!r} in {expr!r}")
                    sel.matchers.append((label, op, value[1:-1]))
                    i += 3
                i += 1
            sels.append(sel)
        elif (kind, text) == ("op", "{"):
            raise AssertionError(f"a selector without a metric name in {expr!r}")
        elif (kind, text) == ("op", "["):
            while toks[i] != ("op", "]"):
                i += 1
            i += 1
        else:
            i += 1
    return Parsed(sels, grouping, aggregated)


@dataclass
class Exposition:
    """Series names (as PromQL sees them) -> label names, and family name -> type."""

    series: dict[str, frozenset[str]]
    families: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Exposition:
        series: dict[str, set[str]] = {}
        families: dict[str, str] = {}
        for fam in text_string_to_metric_families(text):
            families[fam.name] = fam.type
            for s in fam.samples:
                series.setdefault(s.name, set()).update(s.labels)
        return cls({k: frozenset(v) for k, v in series.items()}, families)

    def hint(self, name: str) -> str:
        """Why ``name`` is not a series: the family it may have meant."""
        for suffix in ("_bucket", "_count", "_sum", "_total", ""):
            base = name.removesuffix(suffix) if suffix else name
            if base in self.families:
                kind = self.families[base]
                have = sorted(s for s in self.series if s.startswith(base))
                return f"{base} is a {kind}; its series are {have}"
        return "no such metric"


def check_expr(
    expr: str,
    gateway: Exposition,
    engine: Exposition,
    config: dict[str, Any],
    output_labels: set[str] | None = None,
) -> list[str]:
    """Problems with one PromQL expression (empty: fine).  ``output_labels``: labels a
    legend or an alert annotation reads from the result."""
    problems: list[str] = []
    parsed = parse_promql(expr)
    tiers = {t["name"] for t in config["policy"]["tiers"]}
    pools = {p["name"] for p in config["policy"]["pools"]}
    allowed_values = {"reason": REASONS, "outcome": STATES, "tier": tiers, "band": tiers}
    allowed_values["pool"] = pools
    available: set[str] = set(TARGET_LABELS)
    for sel in parsed.selectors:
        name = sel.metric
        if name in EXTERNAL_METRICS:
            available.update(m[0] for m in sel.matchers)
            continue
        if name.startswith("velvetrope_"):
            expo = gateway
        elif name.startswith("vllm:"):
            expo = engine
        else:
            problems.append(f"{name}: not a velvetrope_* or vllm:* metric")
            continue
        labels = expo.series.get(name)
        if labels is None:
            problems.append(f"{name}: not in the live exposition ({expo.hint(name)})")
            continue
        available |= labels
        for label, op, value in sel.matchers:
            if label not in labels and label not in TARGET_LABELS:
                problems.append(f"{name}: no label {label!r} (has {sorted(labels)})")
            ok = allowed_values.get(label)
            if ok is None or "$" in value or op in ("!=", "!~"):
                continue
            for alt in value.split("|") if op == "=~" else [value]:
                if alt not in ok and alt != ".*":
                    problems.append(f"{name}: {label}={alt!r} is not one of {sorted(ok)}")
    for label in sorted(parsed.grouping - available):
        problems.append(f"grouping label {label!r} is on none of the metrics in {expr!r}")
    if output_labels:
        if parsed.grouping:
            shown = parsed.grouping - {"le"}
        else:
            shown = set() if parsed.aggregated else available
        for label in sorted(output_labels - shown):
            problems.append(f"label {label!r} is shown but not in the result of {expr!r}")
    return problems


# --------------------------------------------------------------------------- where PromQL is


@dataclass
class Expr:
    where: str
    expr: str
    output_labels: set[str] = field(default_factory=set)


def _legend_labels(text: str) -> set[str]:
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", text))


def dashboard_exprs() -> list[Expr]:
    dash = json.loads(DASHBOARD.read_text())
    out: list[Expr] = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            where = f"dashboard panel {p['title']!r} {t['refId']}"
            out.append(Expr(where, t["expr"], _legend_labels(t.get("legendFormat", ""))))
    return out


def alert_exprs() -> list[Expr]:
    out: list[Expr] = []
    for g in _alert_rule()["spec"]["groups"]:
        for r in g["rules"]:
            text = " ".join(r.get("annotations", {}).values())
            shown = set(re.findall(r"\$labels\.(\w+)", text))
            out.append(Expr(f"alert {r.get('alert') or r.get('record')}", r["expr"], shown))
    return out


def alert_test_series() -> list[Expr]:
    out: list[Expr] = []
    for k, t in enumerate(_yaml(ALERT_TESTS)["tests"]):
        for s in t["input_series"]:
            out.append(Expr(f"alerts.test.yaml test {k}", s["series"]))
    return out


def keda_exprs() -> list[Expr]:
    so = _yaml(KEDA)
    return [
        Expr(f"KEDA trigger {i}", t["metadata"]["query"])
        for i, t in enumerate(so["spec"]["triggers"])
        if t["type"] == "prometheus"
    ]


def grafana_variable_queries() -> list[tuple[str, str]]:
    """(metric, label) of every label_values(metric, label) template variable."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\(\s*([\w:]+)\s*,\s*(\w+)\s*\)", q)
        assert m, f"dashboard variable {v['name']}: unexpected query {q!r}"
        out.append((m.group(1), m.group(2)))
    return out


# --------------------------------------------------------------------------- live servers


@dataclass
class Live:
    gateway_url: str
    engine_url: str
    gateway: Exposition
    engine: Exposition
    completion_status: int
    admin_status: int


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Live]:
    """Engine + gateway running the chart's config, started with the Dockerfile's CMD; the
    chart's in-cluster Redis is the suite's own."""
    tmp = tmp_path_factory.mktemp("deploy")
    cfg = _chart_config()
    cfg["state"]["url"] = redis_url
    engine = launch.start_engine("--speed", "50")
    gw: launch.ServerProcess | None = None
    try:
        cfg["upstreams"] = {name: [{"url": engine.url}] for name in cfg["upstreams"]}
        tenant = cfg["policy"]["tenants"][0]["name"]
        cfg["api_keys"] = [{"tenant": tenant, "key": TEST_KEY}]
        # a prior so velvetrope_drain_tokens_per_second exists before a rate is measured
        for p in cfg["policy"]["pools"]:
            p["initial_drain_tokens_per_s"] = 1000.0
        # the file's listen port is not where the gateway listens: --port wins
        cfg["listen"] = {"host": "127.0.0.1", "port": launch.free_port()}
        path = tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        port = launch.free_port()
        cmd = _docker_cmd()
        assert cmd[0] == "velvetrope"
        # the image's command line, on loopback and a free port, with the test's config
        local = {"/etc/velvetrope/gateway.yaml": str(path), "0.0.0.0": "127.0.0.1"}
        local["8080"] = str(port)
        args = [local.get(a, a) for a in cmd[1:]]
        env_name = cfg.get("admin_token_env")
        with pytest.MonkeyPatch.context() as mp:
            if env_name:
                mp.setenv(env_name, ADMIN_TOKEN)
            gw = launch.start(args, f"http://127.0.0.1:{port}", "/readyz")
        auth = {"Authorization": f"Bearer {TEST_KEY}"}
        model = httpx.get(gw.url + "/v1/models", headers=auth).json()["data"][0]["id"]
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            headers=auth,
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
            timeout=30,
        )
        admin = httpx.get(
            gw.url + "/admin/status", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        yield Live(
            gw.url,
            engine.url,
            Exposition.parse(httpx.get(gw.url + "/metrics").text),
            Exposition.parse(httpx.get(engine.url + "/metrics").text),
            r.status_code,
            admin.status_code,
        )
    finally:
        if gw is not None:
            gw.stop()
        engine.stop()


# --------------------------------------------------------------------------- tests: files


def test_every_yaml_and_json_file_parses() -> None:
    files = sorted(p for p in DEPLOY.rglob("*") if p.is_file())
    checked = 0
    for p in files:
        if p.suffix in (".yaml", ".yml"):
            if "templates" in p.parts:
                continue  # Helm templates are Go templates, not YAML (see the chart tests)
            docs = _yaml_docs(p)
            assert docs and all(d is not None for d in docs), f"{p}: empty YAML document"
            checked += 1
        elif p.suffix == ".json":
            json.loads(p.read_text())
            checked += 1
    assert checked >= 6, f"only {checked} YAML/JSON files found under deploy/"


def test_no_secrets_in_deploy_files() -> None:
    values = _values()
    assert "admin_token" not in values["config"], "the admin token belongs in a Secret"
    for k in values["config"].get("api_keys", []):
        assert "key" not in k, "API keys go in as sha256 hashes, never plain"
    for p in DEPLOY.rglob("*"):
        if p.is_file():
            text = p.read_text()
            assert not re.search(r"\bsk-[A-Za-z0-9]{16,}", text), f"{p}: an API key?"
            assert "BEGIN PRIVATE KEY" not in text, f"{p}: a private key"


# --------------------------------------------------------------------------- tests: metrics


@pytest.mark.integration
def test_the_live_gateway_served_the_chart_config(live: Live) -> None:
    assert live.completion_status == 200
    assert live.admin_status == 200, "admin_token_env from the Secret did not reach the gateway"
    for name in ("velvetrope_requests_total", "velvetrope_time_to_first_token_seconds_bucket"):
        assert name in live.gateway.series, f"{name} missing after one request"


@pytest.mark.integration
def test_promql_names_and_labels_exist_in_the_live_exposition(live: Live) -> None:
    config = _chart_config()
    exprs = dashboard_exprs() + alert_exprs() + alert_test_series() + keda_exprs()
    assert len(exprs) > 30
    problems = [
        f"{e.where}: {p}"
        for e in exprs
        for p in check_expr(e.expr, live.gateway, live.engine, config, e.output_labels)
    ]
    assert not problems, "\n".join(problems)
    used = {s.metric for e in exprs for s in parse_promql(e.expr).selectors}
    for required in (
        "velvetrope_queue_depth",
        "velvetrope_in_flight",
        "velvetrope_draining",
        "velvetrope_bucket_fill_ratio",
        "velvetrope_tokens_reserved_total",
        "velvetrope_tokens_settled_total",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert required in used, f"{required} is used nowhere in deploy/"


@pytest.mark.integration
def test_grafana_variables_name_real_labels(live: Live) -> None:
    for metric, label in grafana_variable_queries():
        expo = live.engine if metric.startswith("vllm:") else live.gateway
        assert metric in expo.series, f"variable query: {metric}: {expo.hint(metric)}"
        assert label in expo.series[metric] | TARGET_LABELS, f"{metric} has no label {label}"


def test_dashboard_429_and_503_series_cover_exactly_those_statuses() -> None:
    dash = json.loads(DASHBOARD.read_text())
    found: dict[int, set[str]] = {}
    for p in dash["panels"]:
        for t in p.get("targets", []):
            if t.get("legendFormat") in ("429", "503"):
                m = re.search(r'reason=~"([^"]+)"', t["expr"])
                assert m, t["expr"]
                found[int(t["legendFormat"])] = set(m.group(1).split("|"))
    for status in (429, 503):
        assert found.get(status) == {r.code for r in Reason if r.status == status}, status


def test_dashboard_structure() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]


@pytest.mark.integration
def test_the_checker_catches_mistakes(live: Live) -> None:
    cfg = _chart_config()

    def bad(expr: str) -> bool:
        return bool(check_expr(expr, live.gateway, live.engine, cfg))

    assert not bad('sum by (band) (velvetrope_queue_depth{pool="default"})')
    assert bad("velvetrope_queue_depths")  # misspelt
    assert bad("velvetrope_queue_wait_seconds")  # a histogram has no bare series
    assert bad("velvetrope_queue_depth_count")  # a gauge has no _count
    assert bad('velvetrope_queue_depth{tier="interactive"}')  # label of another metric
    assert bad("sum by (tenant) (velvetrope_in_flight)")  # tenant label is off by default
    assert bad('velvetrope_requests_total{reason=~"rate_limit|queue_full"}')  # not a reason
    assert bad('velvetrope_queue_depth{pool="gpu"}')  # not a pool of the chart's config
    assert bad("vllm:gpu_cache_usage_perc")  # the engine's name is kv_cache_usage_perc
    assert bad("up")  # not ours
    assert check_expr(
        "sum(velvetrope_in_flight)", live.gateway, live.engine, cfg, output_labels={"pool"}
    )


# --------------------------------------------------------------------------- tests: chart


def test_chart_config_is_valid_for_the_gateway() -> None:
    cfg = parse_config(_chart_config(), "values.yaml config", environ={})
    assert cfg.admin_token is None
    assert cfg.admin_token_env == _values()["adminToken"]["envName"]


@pytest.mark.integration
def test_probe_paths_are_the_gateways_routes(live: Live) -> None:
    probes = _values()["probes"]
    assert probes["liveness"]["path"] == "/healthz", "liveness must not depend on the engines"
    assert probes["readiness"]["path"] == "/readyz"
    for kind in ("liveness", "readiness"):
        r = httpx.get(live.gateway_url + probes[kind]["path"])
        assert r.status_code == 200, (kind, r.status_code, r.text)
    assert httpx.get(live.gateway_url + "/no-such-probe").status_code == 404


def test_grace_period_outlasts_prestop_drain_and_shutdown() -> None:
    values = _values()
    drain = parse_config(_chart_config(), environ={}).gateway.drain_grace_s
    needed = values["preStopSleepSeconds"] + drain + _uvicorn_grace_s()
    assert values["terminationGracePeriodSeconds"] > needed
    assert values["terminationGracePeriodSeconds"] > drain
    assert values["preStopSleepSeconds"] > 0


def test_templates_read_only_existing_values_and_balance_their_blocks() -> None:
    values = _values()
    templates = sorted((CHART / "templates").glob("*"))
    kinds = set()
    defined: set[str] = set()
    included: set[str] = set()
    for t in templates:
        text = t.read_text()
        for path in re.findall(r"\.Values((?:\.\w+)+)", text):
            node: Any = values
            for part in path.strip(".").split("."):
                assert isinstance(node, dict) and part in node, f"{t.name}: .Values{path}"
                node = node[part]
        opens = len(re.findall(r"\{\{-?\s*(?:if|range|with|define|block)\b", text))
        ends = len(re.findall(r"\{\{-?\s*end\s*-?\}\}", text))
        assert opens == ends, f"{t.name}: {opens} blocks opened, {ends} closed"
        defined |= set(re.findall(r'\{\{-?\s*define\s+"([^"]+)"', text))
        included |= set(re.findall(r'(?:include|template)\s+"([^"]+)"', text))
        kinds |= set(re.findall(r"^kind:\s*(\w+)", text, re.MULTILINE))
    assert included <= defined, f"undefined templates: {included - defined}"
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceMonitor"} <= kinds


def test_chart_version_matches_the_package() -> None:
    chart = _yaml(CHART / "Chart.yaml")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert str(chart["appVersion"]) == project["version"]


def test_dockerfile_agrees_with_the_chart() -> None:
    d = _dockerfile()
    values = _values()
    assert d["FROM"][0].endswith("AS build") and "python:3.11-slim" in d["ARG"][0]
    assert d["EXPOSE"] == [str(values["containerPort"])]
    assert d["STOPSIGNAL"] == ["SIGTERM"]
    user = d["USER"][-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, "run as a numeric non-root UID"
    assert int(user) == values["podSecurityContext"]["runAsUser"]
    assert any("/healthz" in h and f":{values['containerPort']}/" in h for h in d["HEALTHCHECK"])
    cmd = _docker_cmd()
    assert cmd[:4] == ["velvetrope", "serve", "--config", "/etc/velvetrope/gateway.yaml"]
    assert cmd[cmd.index("--port") + 1] == str(values["containerPort"])
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert "mountPath: /etc/velvetrope\n" in deployment
    assert "gateway.yaml: |" in (CHART / "templates" / "configmap.yaml").read_text()
    # the helm args repeat the image's CMD (with the port from values)
    assert "- /etc/velvetrope/gateway.yaml" in deployment and "- --port" in deployment
    for copy_args in d["COPY"]:
        if copy_args.startswith("--from"):
            continue
        for src in shlex.split(copy_args)[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"


# --------------------------------------------------------------------------- tests: KEDA


def test_keda_scales_the_engines_on_queue_depth() -> None:
    so = _yaml(KEDA)
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    spec = so["spec"]
    assert spec["minReplicaCount"] >= 1, "no Ready gateway with zero engines: no queue, no scale-up"
    assert spec["maxReplicaCount"] >= spec["minReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue", "threshold is per replica; fallback needs it"
    meta = trigger["metadata"]
    assert float(meta["threshold"]) > 0
    assert meta["ignoreNullValues"] == "false", "an empty query must not read as 0"
    assert spec["fallback"]["replicas"] >= spec["minReplicaCount"]
    metrics = {s.metric for s in parse_promql(meta["query"]).selectors}
    assert metrics == {"velvetrope_queue_depth"}
