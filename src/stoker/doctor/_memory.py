"""Memory checks (SK301-SK302): Python containers that every forked worker ends up copying.

A forked worker shares its parent's pages until it writes to them, and reading a Python object
writes to it (its reference count, and the garbage collector's header). A dataset that holds
a list of a million path strings therefore gets copied, page by page, into every worker as it
reads: "copy-on-read". SK301 estimates those bytes from the dataset's attributes without
running workers; SK302 (only when asked) forks real workers, freezes the inherited objects
(``gc.freeze``, so that the garbage collector's own pass over the whole process is not
counted), lets them read samples, and measures how much private memory (USS) each one gained.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
from typing import Any

from stoker._introspect.containers import Container, find_containers
from stoker.doctor._finding import Finding, Severity
from stoker.doctor._subject import Subject

__all__ = ["Container", "check_containers", "find_containers", "measure_worker_growth"]

# Per-worker bytes from which copy-on-read is reported (estimated or measured).
COPY_WARN_BYTES = 64 * 2**20
# Forked measurement: workers, time each may read samples, and how long to wait for them.
MEASURE_WORKERS = 2
MEASURE_SAMPLES = 20_000  # per worker
MEASURE_READ_S = 2.0  # cap per worker
MEASURE_JOIN_S = 30.0


def _fix_for(container: Container) -> str:
    attr = container.path.rsplit(".", 1)[-1]
    head = "# flat arrays have no per-item Python objects to copy:\nimport numpy as np\n"
    if "tuple of" in container.kind or "list of" in container.kind.split(" ", 1)[1]:
        return head + (
            f"paths, labels = zip(*self.{attr})\n"
            "self.paths = np.array(paths, dtype=np.bytes_)  # fixed-width bytes\n"
            "self.labels = np.asarray(labels, dtype=np.int64)\n"
            "# in __getitem__: path, label = self.paths[i].decode(), int(self.labels[i])"
        )
    if container.kind.endswith(" of str"):
        return head + (
            f"self.{attr} = np.array(self.{attr}, dtype=np.bytes_)  # fixed-width bytes\n"
            f"# in __getitem__: self.{attr}[i].decode()"
        )
    if container.kind.endswith((" of int", " of float")):
        return head + f"self.{attr} = np.asarray(self.{attr})"
    return head + (
        f"# store the fields of self.{attr} as one array per field (np.array / np.asarray),\n"
        "# or keep them on disk (np.load(path, mmap_mode='r'))"
    )


def check_containers(subject: Subject, facts: dict[str, Any]) -> list[Finding]:
    """SK301: large Python containers each forked worker will copy as it reads them."""
    root = "loader.dataset" if subject.loader is not None else "dataset"
    containers = find_containers(subject.dataset, root)
    facts["python_containers"] = [
        {"path": c.path, "kind": c.kind, "items": c.items, "bytes": c.bytes} for c in containers
    ]
    total = sum(c.bytes for c in containers)
    if total < COPY_WARN_BYTES:
        return []
    workers = subject.num_workers
    listing = "; ".join(
        f"`{c.path}`: {c.kind}, {c.items:,} items, ~{c.bytes / 2**20:,.1f} MiB"
        for c in containers[:3]
    )
    mib = total / 2**20
    if workers:
        who = "1 worker" if workers == 1 else f"{workers} workers"
        scale = f"{who} may each copy it: up to {workers * mib:,.1f} MiB in all"
    else:
        scale = "each worker may copy it"
    how = (
        "forked workers copy every page whose objects they read (reference counts and the "
        "garbage collector write to them)"
        if subject.start_method == "fork"
        else f"{subject.start_method} workers unpickle a private copy of them each"
    )
    return [
        Finding(
            "SK301",
            Severity.WARNING,
            "The dataset holds large Python containers that each worker will copy",
            f"~{mib:,.1f} MiB of Python objects: {listing}; {scale}",
            f"Python objects cannot be shared between worker processes: {how}. Memory grows "
            "with every worker through the epoch until the machine swaps or the OOM killer "
            "ends the run.",
            _fix_for(containers[0]),
            containers[0].path,
        )
    ]


def _uss() -> int:
    import psutil

    return int(psutil.Process().memory_full_info().uss)


def _measure_child(dataset: Any, indices: range, samples: int, read_s: float, conn: Any) -> None:
    try:
        # Freeze what the parent built so that a garbage collection in this child does not
        # copy every object of the whole process: what remains is what reading samples copies.
        gc.freeze()
        before = _uss()
        deadline = time.monotonic() + read_s
        read = 0
        for i in indices[:samples]:
            dataset[i]
            read += 1
            if time.monotonic() > deadline:
                break
        conn.send(("ok", before, _uss(), read))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}", 0, 0))
    finally:
        conn.close()


def measure_worker_growth(
    dataset: Any,
    *,
    workers: int | None = None,
    samples: int | None = None,
    read_s: float | None = None,
) -> list[tuple[int, int]]:
    """Fork ``workers`` processes that read samples, and return (USS growth, samples read) each.

    Each child freezes the objects it inherited (``gc.freeze()``), reads indices spread over
    the dataset (worker ``w`` takes every ``workers``-th from offset ``w``), at most
    ``samples`` of them within ``read_s`` seconds, and reports how many private bytes (USS)
    it gained meanwhile: the pages that reading copied. Children are joined, and killed if
    they outlive ``MEASURE_JOIN_S``.

    Args:
        dataset: a map-style dataset.
        workers: processes to fork. Default ``MEASURE_WORKERS`` (2).
        samples: samples each reads at most. Default ``MEASURE_SAMPLES`` (20,000).
        read_s: seconds each may read at most. Default ``MEASURE_READ_S`` (2.0).

    Raises:
        RuntimeError: if a child fails to read a sample (the message carries its error).
    """
    workers = MEASURE_WORKERS if workers is None else workers
    samples = MEASURE_SAMPLES if samples is None else samples
    read_s = MEASURE_READ_S if read_s is None else read_s
    ctx = multiprocessing.get_context("fork")
    n = len(dataset)
    results: list[tuple[int, int]] = []
    procs = []
    for w in range(workers):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_measure_child,
            args=(dataset, range(w, n, workers), samples, read_s, child),
            daemon=True,
        )
        proc.start()
        child.close()
        procs.append((proc, parent))
    errors = []
    try:
        for proc, conn in procs:
            if conn.poll(MEASURE_JOIN_S):
                status, a, b, read = conn.recv()
                if status == "ok":
                    results.append((max(0, int(b) - int(a)), int(read)))
                else:
                    errors.append(str(a))
            else:
                errors.append(f"worker pid {proc.pid} sent nothing within {MEASURE_JOIN_S} s")
    finally:
        for proc, conn in procs:
            conn.close()
            proc.join(MEASURE_JOIN_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
            proc.close()
    if errors:
        raise RuntimeError("memory measurement failed: " + "; ".join(errors))
    return results


def check_measured_growth(subject: Subject, facts: dict[str, Any]) -> list[Finding]:
    """SK302: forked workers measured to gain many private bytes (copy-on-read)."""
    if subject.iterable or "fork" not in multiprocessing.get_all_start_methods():
        facts["measured_worker_growth"] = None
        return []
    results = measure_worker_growth(subject.dataset)
    n = len(subject.dataset)
    per_worker = [{"uss_growth_bytes": g, "samples_read": r} for g, r in results]
    facts["measured_worker_growth"] = per_worker
    worst = max(per_worker, key=lambda d: d["uss_growth_bytes"])
    growth = worst["uss_growth_bytes"]
    if growth < COPY_WARN_BYTES:
        return []
    workers = subject.num_workers or MEASURE_WORKERS
    return [
        Finding(
            "SK302",
            Severity.WARNING,
            "Forked workers were measured copying the dataset's memory",
            f"a forked worker gained {growth / 2**20:,.1f} MiB of private memory (USS) after "
            f"reading {worst['samples_read']:,} of {n:,} samples; "
            f"x {workers} workers = {workers * growth / 2**20:,.1f} MiB",
            "Memory that should stay shared with the parent is being copied into each worker "
            "(copy-on-read of Python objects); it grows with workers and through the epoch.",
            "# store per-sample metadata in numpy arrays, not lists/dicts of Python objects\n"
            "# and freeze the parent's objects before the workers fork:\n"
            "import gc\ngc.freeze()  # after building the dataset, before iter(loader)",
            "loader.dataset" if subject.loader is not None else "dataset",
        )
    ]
