"""Machine-resource checks (SK201-SK205): shared memory, cores, threads, open files, pinning.

Each check is a function of explicit readings (free bytes, core counts, limits), so that it can
be driven with the conditions of a container this machine is not; :func:`check_resources`
takes the readings from the live machine.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from typing import Any

from stoker._introspect import platform as _platform
from stoker.doctor._finding import Finding, Severity
from stoker.doctor._subject import Subject
from stoker.transport import GROWTH_FACTOR

__all__ = [
    "check_cores",
    "check_open_files",
    "check_pin_memory",
    "check_resources",
    "check_shm",
    "check_threads",
    "worker_threads",
]

# Share of /dev/shm above which the in-flight batches earn a warning (other processes and
# other loaders use it too).
SHM_WARN_SHARE = 0.5
# Share of the open-files limit above which the in-flight descriptors earn a warning.
FD_WARN_SHARE = 0.5


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def check_shm(
    *,
    shm_path: str,
    free_bytes: int,
    workers: int,
    prefetch: int,
    batch_bytes: int,
    spill_dir: str | None = None,
    slot_factor: float = 1.0,
) -> list[Finding]:
    """SK201: the shared-memory directory cannot hold the batches in flight.

    Args:
        shm_path: the directory batches travel through (``/dev/shm`` for torch).
        free_bytes: its free bytes (``os.statvfs``).
        workers: worker processes.
        prefetch: batches in flight per worker.
        batch_bytes: tensor bytes of one batch.
        spill_dir: where a stoker loader (``shm="auto"``) puts the slots ``shm_path`` has no
            room for; None for torch's loader and ``shm="require"``, which fail instead.
        slot_factor: bytes a batch in flight holds per byte of tensors (stoker's slots are
            made larger than their batch to absorb growth; torch's segments are exact).
    """
    need = int(workers * prefetch * batch_bytes * slot_factor)
    if workers <= 0 or need <= 0 or need <= free_bytes * SHM_WARN_SHARE:
        return []
    short = need > free_bytes
    severity = Severity.ERROR if short and spill_dir is None else Severity.WARNING
    verdict = f"need {_mib(need)}" if short else f"take {_mib(need)}, more than half of it"
    if slot_factor != 1.0:
        verdict = f"(in slots {slot_factor:g}x their size) {verdict}"
    size_gib = max(1, math.ceil(need * 2 / 2**30))
    if spill_dir is None:
        why = (
            "Workers hand batches over in shared memory; when it runs out, workers die with "
            "'Bus error' or 'No space left on device' (Docker gives containers 64 MiB of "
            "/dev/shm by default)."
        )
    else:
        why = (
            "Workers hand batches over in shared memory; stoker puts the batches it has no "
            f"room for in slots under {spill_dir} (page cache, which the kernel may write to "
            "disk), or through the pipe, with one warning: training goes on, but more shared "
            'memory keeps every batch in RAM (`shm="require"` fails instead).'
        )
    return [
        Finding(
            "SK201",
            severity,
            f"{shm_path} is too small for the batches in flight",
            f"{shm_path} has {_mib(free_bytes)} free but {workers} workers x prefetch "
            f"{prefetch} x {_mib(batch_bytes)} batches {verdict}",
            why,
            f"docker run --shm-size={size_gib}g ...   # or in Kubernetes: an emptyDir with "
            "medium: Memory on /dev/shm\n"
            f"DataLoader(..., prefetch_factor=1)  # or fewer workers / smaller batches",
            shm_path,
        )
    ]


def check_cores(
    *,
    workers: int,
    usable: int,
    cpu_count: int,
    affinity: int | None,
    quota: float | None,
    ranks_per_node: int = 1,
) -> list[Finding]:
    """SK202: worker processes (times ranks on this node) exceed the usable cores."""
    total = workers * ranks_per_node
    if workers <= 0 or total <= usable:
        return []
    ranks = (
        f" x {ranks_per_node} ranks on this node (LOCAL_WORLD_SIZE)" if ranks_per_node > 1 else ""
    )
    quota_text = "none" if quota is None else f"{quota:g} cores"
    per_rank = max(1, usable // ranks_per_node - 1)
    return [
        Finding(
            "SK202",
            Severity.WARNING,
            "More worker processes than usable cores",
            f"{workers} workers{ranks} = {total} processes for {usable} usable cores "
            f"(os.cpu_count() {cpu_count}, CPU affinity {affinity}, cgroup quota {quota_text})",
            "Workers beyond the usable cores time-share them: no faster loading, more memory "
            "(each worker copies what it reads), and the training loop loses CPU to them. "
            "In containers os.cpu_count() reports the host's cores, not the quota.",
            f"DataLoader(..., num_workers={per_rank})  # usable_cores() // ranks_per_node - 1\n"
            '# or: stoker.DataLoader(..., num_workers="auto")',
            "loader.num_workers",
        )
    ]


def worker_threads() -> dict[str, int]:
    """Threads each worker's libraries will start: set thread env vars and OpenCV's pool.

    torch's own pool is not counted: DataLoader workers set it to 1 thread.
    """
    threads: dict[str, int] = {}
    for name, value in _platform.thread_env_vars().items():
        if name == "TORCH_NUM_THREADS":
            continue
        try:
            threads[name] = int(value)
        except ValueError:
            continue
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "getNumThreads"):
        threads["cv2.getNumThreads()"] = int(cv2.getNumThreads())
    return threads


def check_threads(*, workers: int, usable: int, threads: dict[str, int]) -> list[Finding]:
    """SK203: per-worker thread pools x workers exceed the usable cores."""
    if workers <= 0 or not threads:
        return []
    name, per_worker = max(threads.items(), key=lambda kv: kv[1])
    total = workers * per_worker
    if per_worker <= 1 or total <= usable:
        return []
    listing = ", ".join(f"{k}={v}" for k, v in sorted(threads.items()))
    return [
        Finding(
            "SK203",
            Severity.WARNING,
            "Thread pools in the workers oversubscribe the cores",
            f"{workers} workers x {per_worker} threads ({name}) = {total} threads for {usable} "
            f"usable cores; per-worker pools: {listing}",
            "Each worker starts its own OpenMP/BLAS/OpenCV thread pool; together they run many "
            "more threads than cores, and the context switches and cache thrash can make "
            "loading several times slower than with one thread per worker.",
            "def worker_init_fn(worker_id):\n"
            "    import cv2; cv2.setNumThreads(1)            # if you use OpenCV\n"
            "    from threadpoolctl import threadpool_limits\n"
            "    threadpool_limits(1)                        # OpenMP / BLAS\n\n"
            "DataLoader(..., worker_init_fn=worker_init_fn)\n"
            "# or launch with OMP_NUM_THREADS=1",
            "environment",
        )
    ]


def check_open_files(
    *,
    soft_limit: int,
    hard_limit: int,
    open_now: int,
    strategy: str,
    workers: int,
    prefetch: int,
    tensors_per_batch: int,
) -> list[Finding]:
    """SK204: torch's ``file_descriptor`` sharing would exhaust the open-files limit."""
    if strategy != "file_descriptor" or workers <= 0 or soft_limit < 0:
        return []
    need = workers * prefetch * tensors_per_batch
    room = soft_limit - open_now
    if need <= room * FD_WARN_SHARE:
        return []
    severity = Severity.ERROR if need > room else Severity.WARNING
    raise_to = hard_limit if hard_limit > 0 else 65536
    return [
        Finding(
            "SK204",
            severity,
            "Batches in flight may exhaust the open-files limit",
            f"{workers} workers x prefetch {prefetch} x {tensors_per_batch} tensors per batch = "
            f"{need} shared-memory file descriptors; the soft limit is {soft_limit} with "
            f"{open_now} already open (hard limit {hard_limit})",
            "With torch's 'file_descriptor' sharing strategy every tensor in flight (and every "
            "one your code keeps) holds a descriptor in the main process; past the limit "
            "loading fails with 'RuntimeError: received 0 items of ancdata' or 'Too many open "
            "files'.",
            "import torch.multiprocessing\n"
            "torch.multiprocessing.set_sharing_strategy('file_system')\n"
            f"# or raise the limit:  ulimit -n {raise_to}\n"
            "# or collate into fewer, larger tensors",
            "torch.multiprocessing sharing strategy",
        )
    ]


def accelerator_available() -> bool:
    """True when torch sees an accelerator pinned memory can serve (CUDA, XPU, MPS...)."""
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        return bool(acc.is_available())
    return bool(torch.cuda.is_available())


def check_pin_memory(*, pin_memory: bool, accelerator: bool) -> list[Finding]:
    """SK205: ``pin_memory=True`` on a machine without an accelerator."""
    if not pin_memory or accelerator:
        return []
    return [
        Finding(
            "SK205",
            Severity.WARNING,
            "`pin_memory=True` on a machine without an accelerator",
            "pin_memory=True but torch sees no CUDA/XPU/MPS device here",
            "There is no device to copy to: torch warns and ignores the flag, or pins for "
            "nothing, paying an extra copy of every batch.",
            "DataLoader(..., pin_memory=torch.cuda.is_available())",
            "loader.pin_memory",
        )
    ]


def check_resources(
    subject: Subject,
    facts: dict[str, Any],
    *,
    batch_bytes: int | None,
    tensors_per_batch: int | None,
    shm_path: str | None = None,
    shm_free: int | None = None,
) -> list[Finding]:
    """Run SK201-SK205 against this machine's readings (recorded in ``facts``)."""
    import torch.multiprocessing

    usable = _platform.usable_cores()
    facts.update(
        usable_cores=usable,
        cpu_count=os.cpu_count(),
        affinity_cores=_platform.affinity_cores(),
        cgroup_cpu_quota=_platform.cgroup_cpu_quota(),
    )
    findings = check_pin_memory(pin_memory=subject.pin_memory, accelerator=accelerator_available())
    workers = subject.num_workers or 0
    if workers <= 0:
        return findings
    path = shm_path or subject.shm_path
    free = shm_free if shm_free is not None else _platform.shm_free_bytes(path)
    facts.update(shm_dir=path, shm_free_bytes=free)
    if batch_bytes:
        spills = subject.is_stoker and getattr(subject.loader, "shm", "auto") != "require"
        findings += check_shm(
            shm_path=path,
            free_bytes=free,
            workers=workers,
            prefetch=subject.prefetch_factor,
            batch_bytes=batch_bytes,
            spill_dir=tempfile.gettempdir() if spills else None,
            slot_factor=GROWTH_FACTOR if subject.is_stoker else 1.0,
        )
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    findings += check_cores(
        workers=workers,
        usable=usable,
        cpu_count=os.cpu_count() or 1,
        affinity=facts["affinity_cores"],
        quota=facts["cgroup_cpu_quota"],
        ranks_per_node=ranks,
    )
    threads = worker_threads()
    facts["worker_threads"] = threads
    findings += check_threads(workers=workers, usable=usable, threads=threads)
    soft, hard = _platform.open_files_limit()
    strategy = "stoker slots" if subject.is_stoker else torch.multiprocessing.get_sharing_strategy()
    facts.update(open_files_soft=soft, open_files_hard=hard, sharing_strategy=strategy)
    if tensors_per_batch:
        findings += check_open_files(
            soft_limit=soft,
            hard_limit=hard,
            open_now=len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0,
            strategy=strategy,
            workers=workers,
            prefetch=subject.prefetch_factor,
            tensors_per_batch=tensors_per_batch,
        )
    return findings
