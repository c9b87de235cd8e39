"""Build hook: the admission core's hot modules, the gateway's per-request modules that need
nothing but the core (the request's reading, the admission bridge, the response headers,
the disconnect watches, the metric updates, the stream relay and its SSE reader), the
engine model's batcher (its state, queues, KV-block pools, events and decode-stretch
fast-forward), the simulator's event loop (``velvetrope/sim/env.py``,
``velvetrope/sim/runner.py``, ``velvetrope/sim/request_side.py``,
``velvetrope/sim/replica_steps.py``) and the shared store's request path
(``velvetrope/store``: the failure policy, the Redis calls and their packing, the replies,
the outbox, the pipeline and its connection), compiled to C with mypyc.

They are typed under ``mypy --strict``; mypyc turns them into C extensions that the gateway
and the simulator import in place of the ``.py`` files (see the README for what it gains).
``VELVETROPE_PURE=1`` at install time builds nothing and the package runs as plain Python.
``pip install -e .`` builds them in place, next to their sources; after editing one of them,
run ``make install`` again (velvetrope refuses to import a module compiled from an older
source; see ``velvetrope/fresh.py``).
"""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

COMPILED = [
    "velvetrope/core/bucket.py",
    "velvetrope/core/capacity.py",
    "velvetrope/core/claims.py",
    "velvetrope/core/controller.py",
    "velvetrope/core/effects.py",
    "velvetrope/core/estimate.py",
    "velvetrope/core/fairness.py",
    "velvetrope/core/job.py",
    "velvetrope/core/job_ends.py",
    "velvetrope/core/job_sizing.py",
    "velvetrope/core/jobheap.py",
    "velvetrope/core/leases.py",
    "velvetrope/core/limit.py",
    "velvetrope/core/ordering.py",
    "velvetrope/core/pool.py",
    "velvetrope/core/preemption.py",
    "velvetrope/core/predictor.py",
    "velvetrope/core/prefix_routing.py",
    "velvetrope/core/request_machine.py",
    "velvetrope/core/routing.py",
    "velvetrope/core/saturation.py",
    "velvetrope/core/scheduler.py",
    "velvetrope/core/tuples.py",
    "velvetrope/engine/batch_state.py",
    "velvetrope/engine/batcher.py",
    "velvetrope/engine/decode_math.py",
    "velvetrope/engine/events.py",
    "velvetrope/engine/fastforward.py",
    "velvetrope/engine/kvcache.py",
    "velvetrope/engine/prefix_cache.py",
    "velvetrope/engine/queues.py",
    "velvetrope/gateway/api/admission_headers.py",
    "velvetrope/gateway/api/disconnects.py",
    "velvetrope/gateway/api/parse.py",
    "velvetrope/gateway/driver/admission.py",
    "velvetrope/gateway/ops/series.py",
    "velvetrope/gateway/upstream/relay.py",
    "velvetrope/openai/sse.py",
    "velvetrope/sim/env.py",
    "velvetrope/sim/replica_steps.py",
    "velvetrope/sim/request_side.py",
    "velvetrope/sim/runner.py",
    "velvetrope/store/breaker.py",
    "velvetrope/store/call_guard.py",
    "velvetrope/store/guard.py",
    "velvetrope/store/leases.py",
    "velvetrope/store/memory.py",
    "velvetrope/store/outbox.py",
    "velvetrope/store/pipeline.py",
    "velvetrope/store/redis_store.py",
    "velvetrope/store/replies.py",
    "velvetrope/store/resp.py",
    "velvetrope/store/settlement.py",
    "velvetrope/store/wire.py",
]


class OptionalBuildExt(build_ext):
    """Build the compiled core if this machine can (a C compiler and the Python headers);
    else say so and install plain Python, which behaves the same, only slower."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # any build failure means: no extensions
            print(f"velvetrope: the compiled core was not built ({e}); installing plain Python")
            for ext in self.extensions:  # none of them, or the shared runtime could be missing
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)


class BuildPyWithCommit(build_py):
    """Write the commit this build comes from into the package (``velvetrope/BUILD_COMMIT``),
    for ``velvetrope --version`` where there is no git (``velvetrope/build_info.py``).
    Outside a git checkout (an sdist) nothing is written and the version says ``unknown``."""

    def run(self) -> None:
        super().run()
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"],
                cwd=os.path.dirname(os.path.abspath(__file__)),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return
        target = os.path.join(self.build_lib, "velvetrope", "BUILD_COMMIT")
        if os.path.isdir(os.path.dirname(target)):
            with open(target, "w", encoding="utf-8") as f:
                f.write(commit + "\n")


ext_modules = []
if os.environ.get("VELVETROPE_PURE") != "1":
    from mypyc.build import mypycify

    ext_modules = mypycify(COMPILED, opt_level="3")

setup(
    ext_modules=ext_modules,
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithCommit},
)
