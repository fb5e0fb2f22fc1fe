"""Hand-built bench results for tests of the arithmetic and the report."""

from __future__ import annotations

from typing import Any

from stoker.bench._result import BenchResult, ContenderResult, GridPoint, RunSample, WorkloadResult
from stoker.bench._stats import Ideal


def runs(*rates: float, batch: int = 64, batches: int = 10, **extra: Any) -> tuple[RunSample, ...]:
    """One run per rate (samples/s), each of ``batches`` batches."""
    samples = batch * batches
    return tuple(
        RunSample(
            seconds=samples / rate,
            samples=samples,
            batches=batches,
            first_batch_s=extra.get("first_batch_s", 0.01),
            main_cpu_s=extra.get("main_cpu_s", 0.05),
            tree_cpu_s=extra.get("tree_cpu_s", 0.5),
            peak_pss_bytes=extra.get("peak_pss_bytes", 300 * 2**20),
            epoch_first_batch_s=tuple(extra.get("epochs", ())),
        )
        for rate in rates
    )


def contender(
    name: str,
    library: str,
    roles: tuple[str, ...],
    *rates: float,
    nw: int = 0,
    error: str | None = None,
    **extra: Any,
) -> ContenderResult:
    return ContenderResult(
        name=name,
        library=library,
        roles=roles,  # type: ignore[arg-type]
        config={
            "num_workers": nw,
            "prefetch_factor": None,
            "persistent_workers": None,
            "pin_memory": False,
        },
        runs=() if error else runs(*rates, **extra),
        error=error,
    )


def workload(
    name: str = "tiny",
    stoker_rates: tuple[float, ...] = (300.0, 310.0, 290.0),
    stoker_error: str | None = None,
    mode: str = "steady",
) -> WorkloadResult:
    return WorkloadResult(
        name=name,
        description="a test workload",
        batch_size=64,
        mode=mode,
        ideal=Ideal(
            cores=2, cpu_s_per_sample=0.004, wall_s_per_sample=0.005, samples=100, note="test ideal"
        ),
        contenders=(
            contender("torch nw=0", "torch", ("torch-nw0",), 100.0, 120.0, 110.0),
            contender(
                "torch nw=1 pf=4",
                "torch",
                ("torch-recommended", "torch-best"),
                150.0,
                140.0,
                160.0,
                nw=1,
            ),
            contender("torch nw=2 pf=2", "torch", ("torch-same",), 120.0, 125.0, 130.0, nw=2),
            contender(
                "stoker nw=2", "stoker", ("stoker",), *stoker_rates, nw=2, error=stoker_error
            ),
        ),
        grid=(GridPoint(0, None, 105.0), GridPoint(1, 4, 150.0), GridPoint(4, 2, None, "boom")),
        notes=("a note",),
    )


def result(*workloads: WorkloadResult) -> BenchResult:
    return BenchResult(
        workloads=workloads or (workload(),),
        quick=True,
        repeats=3,
        machine={"usable_cores": 2, "torch": "2.13.0", "cpu": "test CPU"},
        started_at="2026-11-22T12:00:00+00:00",
        duration_s=42.0,
    )
