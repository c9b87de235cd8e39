"""``velvetrope demo``: the same overload through the gateway and straight to the engines,
first come first served and with the tier as the engines' own priority.

What :func:`run_demo` does, in about 105 seconds with the defaults (two engines at ``speed`` 3
on the ``llama3-8b-a100`` profile: about 37 requests/s of the trace's mix, 6-7k streamed
tokens/s, which two shared cores can carry; the default H100 profile at speed 10 would be
~360 requests/s, far beyond them):

1. **Workload.**  A window of the Azure conversation trace (``azure_conv``, 2023; see
   ``velvetrope/data/traces/README.md``) from ``trace_start_s``, its requests assigned to the
   example config's three tenants (acme: interactive 20 %, globex: standard 30 %, initech:
   batch 50 %), and compressed in time so that the offered rate is ``overload`` × the
   engines' capacity for ``window_s`` seconds.
2. **Capacity** is derived from the engine model the servers run
   (:func:`velvetrope.sim.capacity.replica_capacity`: a closed-loop run of the batcher at
   full concurrency on the window's own length mix), times ``speed``, times two engines.  The
   capacity behind the gateway's slot limit (``max_in_flight`` spread over the engines) is
   derived the same way and shown too.  Every run also *measures* throughput.
3. **Processes.**  Two ``velvetrope engine`` servers (``--profile``, ``--speed``, and
   ``--scheduling priority``, vLLM's ``--scheduling-policy priority``, when a pool of the
   config forwards the engine priority, ``pools[].engine_priority``, as the example's does)
   and ``velvetrope serve`` with the example config (``examples/gateway.yaml``) whose listen
   port and upstream URLs are rewritten to free loopback ports; everything on 127.0.0.1.
4. **Run 1** replays the workload open-loop (:mod:`velvetrope.demo.loadgen`) through the gateway
   with each tenant's API key; **run 2** replays the same requests at the same times straight
   to the engines, round-robin, with no admission and no ``priority`` field (first come,
   first served, also in priority mode: :func:`~velvetrope.demo.run.start_engines`);
   **run 3** (engines in priority mode only) does the same with each request carrying its
   tier's index in ``policy.tiers`` as ``priority`` (0 = the top tier): what a user gets
   from the engines' own priority scheduler.  Each run starts once the engines are idle and
   lasts at most ``window_s + drain_s``: requests still open then are cut (and reported as
   such, never dropped).
5. **Live view** (rich) while each run goes: the loadgen's counters, the gateway's queue by
   band and in-flight count (``/admin/status``), the engines' running and waiting sequences
   (their vLLM ``/metrics``).
6. **Report:** one table, per tier and run: requests, completed, p50/p99 TTFT and end-to-end
   latency, rejected by reason, cut at the deadline, and goodput (requests completed within
   the tier's SLO, per second of the window; SLOs from the config's ``tiers[].slo`` and the
   simulator's definition, :func:`velvetrope.sim.metrics.within_slo`); per run, throughput,
   requests in SLO and the tokens generated for requests never completed; per tier, whether
   the gateway has at least as many requests in SLO as the engines' priority run; and a PNG
   plot (``out_dir/demo.png``).

Latencies, SLOs and rates are **wall seconds at demo speed**: the engines run ``speed``
times faster than the modelled GPU.  Percentiles are over the requests that were not turned
away; a request cut at the deadline counts with the time it had waited, and a percentile
that lands on or above such a request is printed as a lower bound (``≥``).

Every process started is stopped (by its PID) when the demo ends, on error and on Ctrl-C.
Bad settings raise :class:`~velvetrope.errors.PolicyError`; a missing or unusable config
raises :class:`~velvetrope.errors.ConfigError`.

Modules: :mod:`.settings` (what can vary, the three runs), :mod:`.workload` (step 1-2),
:mod:`.loadgen` (the open-loop load generator, also the benchmarks'; what it sends in
:mod:`.replay_config`, what it records in :mod:`.replay_results`), :mod:`.live` (polling
and the live view), :mod:`.summary` (the table), :mod:`.plot` (the PNG) and :mod:`.run`
(:func:`run_demo`: processes, runs, report).
"""

from velvetrope.demo.live import PhaseSample, RunResult
from velvetrope.demo.run import DemoReport, run_demo
from velvetrope.demo.settings import DEFAULT_CONFIG, DemoSettings
from velvetrope.demo.summary import Percentile, TierSummary, render_table, slo_met, summarize
from velvetrope.demo.workload import Capacity, Workload, build_workload

__all__ = [
    "DEFAULT_CONFIG",
    "Capacity",
    "DemoReport",
    "DemoSettings",
    "Percentile",
    "PhaseSample",
    "RunResult",
    "TierSummary",
    "Workload",
    "build_workload",
    "render_table",
    "run_demo",
    "slo_met",
    "summarize",
]
