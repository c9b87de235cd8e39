#!/usr/bin/env bash
# Checks that need external tools the test suite does not install (promtool from Debian's
# `prometheus` package; helm).  Run by hand where they exist:  bash deploy/verify-tools.sh
set -euo pipefail
cd "$(dirname "$0")"
if command -v promtool >/dev/null; then
  tmp=$(mktemp -d)
  python3 - "$tmp" <<'PY'
import sys, yaml, pathlib
out = pathlib.Path(sys.argv[1])
doc = yaml.safe_load(open("prometheus/alerts.yaml"))
rules = doc["spec"]
(out / "alerts.full.yaml").write_text(yaml.safe_dump(rules))
for g in rules["groups"]:  # promtool's unit tests compare annotations verbatim
    for r in g["rules"]:
        r.pop("annotations", None)
(out / "alerts.rules.yaml").write_text(yaml.safe_dump(rules))
PY
  promtool check rules "$tmp/alerts.full.yaml"
  cp prometheus/alerts.test.yaml "$tmp/" && (cd "$tmp" && promtool test rules alerts.test.yaml)
else
  echo "promtool not found: skipped the rule checks"
fi
if command -v helm >/dev/null; then
  helm lint --strict helm/velvetrope
  helm template rel helm/velvetrope --namespace llm >/dev/null
else
  echo "helm not found: skipped the chart checks"
fi
