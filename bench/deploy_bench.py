"""What a user installs and deploys, measured: the wheel, the base install, the served process
and the chart.

1. builds the wheel of this checkout as the image does (the core compiled with mypyc;
   ``--pure`` skips the compile, seconds instead of minutes): ``wheel_mb``;
2. installs it into a fresh virtualenv (with pip, ``.pyc`` compiled, as ``pip install
   velvetrope`` does) with no extra, under ``deploy/constraints.txt``: the virtualenv's size
   is ``gateway_install_mb`` (what the image's /opt/venv holds), limit 150 MB; then runs the
   image's compile check there (``python -P -m velvetrope.compiled setup.py``);
3. starts that install's ``velvetrope serve`` with the chart's rendered config (its Redis and
   engines absent: idle, ``/healthz``) and reads its resident set: ``serve_rss_mb``;
4. renders the chart for every value set of :mod:`harness.chart` and validates every object
   (Kubernetes 1.28/1.30/1.33 schemas, vendored CRDs), plus ``deploy/keda``'s files:
   ``chart_value_sets`` and ``schema_checks``; and renders each value set the chart must
   refuse.

Ends with one line::

    deploy: wheel_mb=.. gateway_install_mb=.. serve_rss_mb=.. chart_value_sets=..
            schema_checks=.. failures=0                             (on one line)

``failures`` counts failed schema checks, renders not refused, a failed compile check (not
with ``--pure``) and an install over the limit; the exit status is 1 when it is not 0.

Run: ``.venv/bin/python bench/deploy_bench.py [--pure]`` (``make deploy-bench``).  Installs
reach the package index through pip (its cache makes a repeat quick).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from serve_rss import measure

from harness.chart import REFUSED, VALUE_SETS, render, render_error, validate
from harness.wheelenv import CONSTRAINTS, ROOT, build_wheel, install, make_venv, tree_mb
from velvetrope.serving.launch import free_port

INSTALL_LIMIT_MB = 150.0


def chart_checks() -> tuple[int, int, list[str]]:
    """(value sets rendered, schema checks run, failure lines)."""
    failures: list[str] = []
    checks = 0
    for name, values in VALUE_SETS.items():
        for obj in render(values, name).objects:
            for line in validate(obj):
                checks += 1
                if not line.startswith("ok "):
                    failures.append(f"{name}: {line}")
    for path in sorted((ROOT / "deploy" / "keda").glob("*.yaml")):
        for line in validate(yaml.safe_load(path.read_text())):
            checks += 1
            if not line.startswith("ok "):
                failures.append(f"{path.name}: {line}")
    for name, (values, phrase) in REFUSED.items():
        try:
            error = render_error(values)
        except AssertionError as exc:
            error = str(exc)
        if phrase not in error:
            failures.append(f"refusal {name}: {error}")
    return len(VALUE_SETS), checks, failures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pure", action="store_true", help="build the wheel without mypyc")
    a = ap.parse_args()
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="velvetrope-deploy-bench-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(work / "dist", pure=a.pure)
        wheel_mb = wheel.stat().st_size / 1e6
        print(f"wheel: {wheel.name} {wheel_mb:.2f} MB")
        python = make_venv(work / "venv", with_pip=True)
        install(python, str(wheel), CONSTRAINTS)
        install_mb = tree_mb(work / "venv")
        print(f"base install: {install_mb:.1f} MB in a fresh virtualenv (limit {INSTALL_LIMIT_MB})")
        if install_mb > INSTALL_LIMIT_MB:
            failures.append(f"gateway install {install_mb:.1f} MB > {INSTALL_LIMIT_MB}")
        check = subprocess.run(
            [str(python), "-P", "-m", "velvetrope.compiled", str(ROOT / "setup.py")],
            capture_output=True,
            text=True,
            cwd=work,
            check=False,
        )
        print(f"compile check: {(check.stdout + check.stderr).strip()}")
        if check.returncode != 0 and not a.pure:
            failures.append("the installed wheel's core is not compiled")

        (cm,) = render({}).kind("ConfigMap")
        config = work / "gateway.yaml"
        config.write_text(cm["data"]["gateway.yaml"])
        port = free_port()
        env = {"VELVETROPE_ADMIN_TOKEN": "bench", "VELVETROPE_REDIS_PASSWORD": "bench"}
        rss, names = measure(
            [str(python.with_name("velvetrope"))],
            ["serve", "--config", str(config), "--port", str(port)],
            env,
            port,
        )
        print(f"serve (chart config, idle): VmRSS {rss:.1f} MiB, {len(names)} modules")

    value_sets, checks, chart_failures = chart_checks()
    failures += chart_failures
    for line in failures:
        print(f"FAIL {line}")
    print(
        f"deploy: wheel_mb={wheel_mb:.2f} gateway_install_mb={install_mb:.1f} "
        f"serve_rss_mb={rss:.1f} chart_value_sets={value_sets} schema_checks={checks} "
        f"failures={len(failures)}"
    )
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
