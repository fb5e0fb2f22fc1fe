"""``stoker.diagnose``: run every runtime check on a loader, a dataset or a factory."""

from __future__ import annotations

from typing import Any

import torch

from stoker.doctor._distributed import local_rank_device
from stoker.doctor._finding import Diagnosis, Finding
from stoker.doctor._handles import check_cuda_fork, check_handles
from stoker.doctor._memory import check_containers, check_measured_growth
from stoker.doctor._pickling import check_pickling
from stoker.doctor._resources import check_resources
from stoker.doctor._runtime import (
    check_process,
    check_sample_types,
    check_sampling,
    sample,
)
from stoker.doctor._subject import subject_of

__all__ = ["diagnose"]


def diagnose(
    obj: Any,
    *,
    measure_memory: bool = False,
    shm_dir: str | None = None,
    shm_free_bytes: int | None = None,
    target: str | None = None,
) -> Diagnosis:
    """Diagnose a live DataLoader, Dataset or zero-argument factory returning either.

    Reads a few samples in this process (at most a couple of seconds), and checks picklability
    for spawn/forkserver workers, fork-unsafe handles, large Python containers, per-sample
    latency, sample types, collate cost, shared memory, cores, threads and open files. A
    dataset that opens files lazily will have them open after the diagnosis.

    Args:
        obj: a ``torch.utils.data.DataLoader`` (stoker's included), a Dataset, or a function
            taking no arguments that returns one of them.
        measure_memory: also fork real workers and measure their private-memory growth (SK302).
            Default ``False``; takes a few seconds.
        shm_dir: the shared-memory directory to check. Default: /dev/shm for torch's loader,
            ``stoker._introspect.platform.shm_dir()`` for stoker's.
        shm_free_bytes: free bytes to assume for ``shm_dir``. Default: measured (statvfs).
        target: the name to show for what was diagnosed. Default: the object's type.

    Returns:
        A :class:`Diagnosis` with findings and the measurements (``facts``) behind them.

    Raises:
        ConfigError: if ``obj`` is not a loader, a dataset or a factory returning one.
        RuntimeError: if ``measure_memory`` is set and a measuring worker fails.
    """
    subject = subject_of(obj)
    facts: dict[str, Any] = {
        "kind": subject.describe(),
        "num_workers": subject.num_workers,
        "batch_size": subject.batch_size,
        "prefetch_factor": subject.prefetch_factor if subject.has_workers else None,
        "start_method": subject.start_method,
    }
    findings: list[Finding] = []
    findings += check_process(subject)
    findings += local_rank_device()  # SK503
    findings += check_cuda_fork(
        cuda_initialized=torch.cuda.is_initialized(),
        start_method=subject.start_method,
        workers=subject.num_workers or 0,
    )
    # Before sampling: reading a sample may open handles lazily (the right pattern).
    findings += check_handles(subject)
    findings += check_pickling(subject, facts)
    findings += check_containers(subject, facts)
    run = sample(subject)
    if run.times:
        facts["samples_read"] = len(run.times)
        facts["sample_ms_median"] = round(sorted(run.times)[len(run.times) // 2] * 1e3, 3)
        facts["sample_ms_max"] = round(max(run.times) * 1e3, 3)
    facts["batch_bytes"] = run.batch_bytes
    facts["tensors_per_batch"] = run.tensors_per_batch
    if run.collate_s is not None:
        facts["collate_ms"] = round(run.collate_s * 1e3, 3)
    findings += check_sampling(subject, run)
    findings += check_sample_types(subject, run)
    findings += check_resources(
        subject,
        facts,
        batch_bytes=run.batch_bytes,
        tensors_per_batch=run.tensors_per_batch,
        shm_path=shm_dir,
        shm_free=shm_free_bytes,
    )
    if measure_memory:
        findings += check_measured_growth(subject, facts)
    return Diagnosis(target=target or subject.describe(), findings=tuple(findings), facts=facts)
