"""Idle memory of ``velvetrope serve``, beside the same gateway started from Python.

Starts, in turn, on a free loopback port:

* the real command, ``velvetrope serve --config examples/gateway.yaml --port P`` (the
  console script next to this interpreter), and
* the same gateway started from Python: ``python -c`` code that calls
  :func:`velvetrope.config.load_config` and :func:`velvetrope.gateway.api.server.serve`, the
  port given as ``VELVETROPE__LISTEN__PORT``.

Each is waited for (bounded) until ``/healthz`` answers 200; its upstreams need not run
(``/readyz`` would then answer 503, which is not what this measures).  Its idle resident
set is then read from ``/proc/<pid>/status`` (``VmRSS``), and the process is stopped by its
PID.  Both run with ``PYTHONPROFILEIMPORTTIME=1``: each import is written to the process's
stderr as it happens and nothing of it is kept (the same VmRSS with and without it, within
0.2 MiB, measured).  From that log, ``modules`` is the number of modules the command
imported and ``heavy`` the packages among them that ``serve`` must not import
(:data:`velvetrope.cli.SERVE_MUST_NOT_IMPORT`: the simulator, the planner, numpy, scipy,
matplotlib, ...).  Ends with::

    serve_rss: idle_rss_mb=<R> limit_mb=80 python_rss_mb=<P> modules=<N> python_modules=<M>
               heavy=<none|name,...>                     (on one line)

and exits 1 if ``R`` is over ``--limit-mb`` or ``heavy`` is not ``none``.

Run: ``.venv/bin/python bench/serve_rss.py [--config examples/gateway.yaml]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from velvetrope.cli import SERVE_MUST_NOT_IMPORT
from velvetrope.serving.launch import free_port, start, vm_rss_mb

ROOT = Path(__file__).resolve().parent.parent

FROM_PYTHON = (
    "import sys\n"
    "from velvetrope.config import load_config\n"
    "from velvetrope.gateway.api.server import serve\n"
    "serve(load_config(sys.argv[1]))\n"
)
"""The gateway started from Python: the config file is ``argv[1]``."""


def imported(importtime_log: str) -> set[str]:
    """The module names in the output of ``-X importtime`` (``import time: a | b | name``)."""
    names = set()
    for line in importtime_log.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line: "self [us] | cumulative | imported package"
                names.add(name)
    return names


def heavy(names: set[str]) -> list[str]:
    """The packages of ``SERVE_MUST_NOT_IMPORT`` of which ``names`` holds a module."""
    return [h for h in SERVE_MUST_NOT_IMPORT if any(n == h or n.startswith(h + ".") for n in names)]


def measure(
    program: list[str], args: list[str], env: dict[str, str], port: int
) -> tuple[float, set[str]]:
    """Start ``program args``, wait for ``/healthz``, return (idle RSS in MiB, modules)."""
    server = start(
        args,
        f"http://127.0.0.1:{port}",
        "/healthz",
        program=program,
        env={"PYTHONPROFILEIMPORTTIME": "1", **env},
    )
    try:
        rss = vm_rss_mb(server.pid)
        names = imported(server.stderr_text())
    finally:
        server.stop()
    return rss, names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "examples" / "gateway.yaml"))
    ap.add_argument("--limit-mb", type=float, default=80.0)
    a = ap.parse_args()

    script = Path(sys.executable).with_name("velvetrope")
    found = str(script) if script.exists() else shutil.which("velvetrope")
    if found is None:
        sys.exit("serve_rss: no `velvetrope` console script (run `make install`)")

    port = free_port()
    rss, names = measure([found], ["serve", "--config", a.config, "--port", str(port)], {}, port)
    print(f"velvetrope serve: idle VmRSS {rss:.1f} MiB, {len(names)} modules imported")
    port = free_port()
    py_rss, py_names = measure(
        [sys.executable, "-c", FROM_PYTHON],
        [a.config],
        {"VELVETROPE__LISTEN__PORT": str(port)},
        port,
    )
    print(f"gateway from Python: idle VmRSS {py_rss:.1f} MiB, {len(py_names)} modules imported")
    extra = names - py_names
    tops = sorted({n.split(".")[0] for n in extra})
    print(f"imported by the command only: {len(extra)} modules, of {' '.join(tops)}")

    found_heavy = heavy(names)
    print(
        f"serve_rss: idle_rss_mb={rss:.1f} limit_mb={a.limit_mb:g} python_rss_mb={py_rss:.1f} "
        f"modules={len(names)} python_modules={len(py_names)} "
        f"heavy={','.join(found_heavy) or 'none'}"
    )
    if rss > a.limit_mb or found_heavy:
        sys.exit(1)


if __name__ == "__main__":
    main()
