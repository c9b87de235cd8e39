"""A sweep gives byte-identical results serially, on a local process pool and on a real local
Dask cluster (two worker processes started here)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from concurrent.futures import Executor

import numpy as np
import pytest
from distributed import LocalCluster

from velvetrope.cluster import sweep_executor
from velvetrope.engine import load_profile
from velvetrope.errors import PolicyError
from velvetrope.sim.inputs import default_policy, prepare_workload
from velvetrope.sim.sweep import SweepResult, parse_sweep, run_sweep
from velvetrope.sim.tenant_mix import TenantMix

MIX = TenantMix.parse("gold:interactive:0.3,bronze:batch:0.7")


def _digest(result: SweepResult) -> str:
    """Every byte a sweep produces: the report and each point's per-request records."""
    h = hashlib.sha256(result.to_markdown().encode())
    for params, res in result.points:
        h.update(repr(sorted(params.items())).encode())
        h.update(repr(res.span_s).encode())
        for f in dataclasses.fields(res.records):
            value = getattr(res.records, f.name)
            if value is None:  # an optional column the run did not fill
                continue
            h.update(f.name.encode())
            h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[str]:
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


@pytest.mark.integration
def test_serial_pool_and_cluster_give_the_same_bytes(local_cluster: str) -> None:
    workload = prepare_workload("azure_conv", tenants=MIX, seed=0, limit=200)
    policy = default_policy(MIX, 1)
    profile = load_profile("llama3-8b-h100")
    sweep = parse_sweep(["policy=fifo,hybrid", "seed=0,1", "lengths=noisy:0.5"])
    base = {"replicas": 1, "label": "azure_conv"}

    def run(executor: Executor | None) -> SweepResult:
        return run_sweep(
            policy, workload, profile, sweep, base=base, progress=False, executor=executor
        )

    serial = run(None)
    assert [p for p, _ in serial.points] == [
        {"policy": pol, "seed": seed, "lengths": "noisy:0.5"}
        for pol in ("fifo", "hybrid")
        for seed in ("0", "1")
    ]
    # the seed matters (the noisy predictor), so equal digests are not an accident
    assert serial.points[0][1].records.predicted.tolist() != (
        serial.points[1][1].records.predicted.tolist()
    )
    with sweep_executor(workers=2) as pool:
        assert pool is not None
        on_pool = run(pool)
    with sweep_executor(cluster=local_cluster) as dask:
        assert dask is not None
        on_cluster = run(dask)
    assert _digest(on_pool) == _digest(serial)
    assert _digest(on_cluster) == _digest(serial)


def test_executor_choices() -> None:
    with sweep_executor(workers=1) as ex:
        assert ex is None
    with pytest.raises(PolicyError), sweep_executor(workers=2, cluster="tcp://127.0.0.1:1"):
        pass
    with pytest.raises(PolicyError):
        parse_sweep(["seed=-1"])


def test_a_shared_input_is_pickled_once_and_unpickled_once_per_process() -> None:
    import pickle

    from velvetrope.sim.shared import Shared

    value = [{"n": i} for i in range(1000)]
    shared = Shared(value)
    assert shared.get() is value  # in the process that made it: the value itself
    blob = pickle.dumps(shared)
    assert len(blob) < shared.nbytes + 200  # one byte string, not a walk over the list
    first, second = pickle.loads(blob), pickle.loads(blob)  # two tasks in one worker
    assert first.get() == value and first.get() is not value
    assert second.get() is first.get()  # unpickled once for both
    assert Shared([1]).get() == [1] and pickle.loads(pickle.dumps(Shared([1]))).get() == [1]


def test_sweep_timing_reports_speedup_efficiency_and_cpu() -> None:
    from velvetrope.cluster import SweepTiming

    t = SweepTiming(
        runs=8, workers=2, serial_s=40.0, parallel_s=25.0, serial_cpu_s=38.0, parallel_cpu_s=40.0
    )
    assert t.speedup == pytest.approx(1.6)
    assert t.efficiency == pytest.approx(0.8)
    assert t.cpu_share == pytest.approx(0.8)
    assert t.line() == (
        "sweep: runs=8 workers=2 serial_s=40.0 parallel_s=25.0 speedup=1.60 efficiency=0.80 "
        "cpu_per_run_serial_s=4.75 cpu_per_run_parallel_s=5.00 cpu_share=0.80"
    )
    for bad in ({"workers": 0}, {"parallel_s": 0.0}, {"serial_cpu_s": float("nan")}):
        kw = {
            "runs": 1, "workers": 2, "serial_s": 1.0, "parallel_s": 1.0,
            "serial_cpu_s": 1.0, "parallel_cpu_s": 1.0, **bad,
        }  # fmt: skip
        with pytest.raises(PolicyError):
            SweepTiming(**kw)  # type: ignore[arg-type]
