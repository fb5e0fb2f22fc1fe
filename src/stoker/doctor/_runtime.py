"""Runtime checks on a live dataset (SK401-SK409): a few samples read in this process.

Sampling reads at most ``SAMPLE_MAX`` items (spread over the dataset) within
``SAMPLE_BUDGET_S`` seconds, and collates them once; the timings and the batch size it yields
feed the latency, sample-type, collate and resource checks.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from stoker.doctor._finding import Finding, Severity
from stoker.doctor._subject import Subject

__all__ = ["SampleRun", "check_process", "check_sample_types", "check_sampling", "sample"]

SAMPLE_MAX = 16
SAMPLE_BUDGET_S = 2.0
COLLATE_MAX = 32
# Latency tail: the slowest sample (first excluded) against the median.
TAIL_RATIO = 5.0
TAIL_MIN_S = 0.005
TAIL_MIN_SAMPLES = 8
TAIL_REREADS = 2
# Collate share of (reading + collating) the same samples from which SK404 fires.
COLLATE_SHARE = 0.3
COLLATE_MIN_S = 0.001
COLLATE_REPEATS = 3
BIG_LIST = 1000


@dataclass
class SampleRun:
    """What sampling measured."""

    times: list[float] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)  # the index read, per sample (map-style)
    samples: list[Any] = field(default_factory=list)
    collate_s: float | None = None
    batch_bytes: int | None = None
    tensors_per_batch: int | None = None
    error: str | None = None
    where: str | None = None


def _leaves(obj: Any, path: str = "sample", depth: int = 0) -> Iterator[tuple[str, Any]]:
    yield path, obj
    if depth > 3:
        return
    if isinstance(obj, dict):
        for k, v in list(obj.items())[:64]:
            yield from _leaves(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(obj, (list, tuple)) and len(obj) < BIG_LIST:
        for i, v in enumerate(obj[:64]):
            yield from _leaves(v, f"{path}[{i}]", depth + 1)


def _tensor_stats(batch: Any) -> tuple[int, int]:
    nbytes = count = 0
    stack = [batch]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            nbytes += obj.element_size() * obj.nelement()
            count += 1
        elif isinstance(obj, np.ndarray):
            nbytes += obj.nbytes
            count += 1
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return nbytes, count


def _indices(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})


def sample(
    subject: Subject, *, max_samples: int = SAMPLE_MAX, budget_s: float = SAMPLE_BUDGET_S
) -> SampleRun:
    """Read a few samples, time each, collate them once and size the batch."""
    run = SampleRun()
    ds = subject.dataset
    deadline = time.perf_counter() + budget_s
    try:
        if subject.iterable:
            it = iter(ds)
            source: Iterator[tuple[str, Any]] = ((f"item {j}", it) for j in range(max_samples))
        else:
            source = ((f"index {i}", i) for i in _indices(len(ds), max_samples))
        for where, key in source:
            run.where = where
            t0 = time.perf_counter()
            item = next(key) if subject.iterable else ds[key]
            run.times.append(time.perf_counter() - t0)
            if not subject.iterable:
                run.keys.append(key)
            run.samples.append(item)
            if time.perf_counter() > deadline and len(run.times) >= 2:
                break
    except StopIteration:
        pass
    except Exception:
        run.error = traceback.format_exc(limit=-3)
        return run
    if not run.samples:
        return run
    batch_size = subject.batch_size
    try:
        if batch_size is None and subject.loader is not None:
            batch = (subject.collate_fn or tud.default_convert)(run.samples[0])
            run.collate_s = None
            k, scale = 1, 1.0
        else:
            k = min(len(run.samples), batch_size or COLLATE_MAX)
            collate = subject.collate_fn or tud.default_collate
            best = float("inf")
            for _ in range(COLLATE_REPEATS):  # the fastest of a few: one stall is not the cost
                t0 = time.perf_counter()
                batch = collate(run.samples[:k])
                best = min(best, time.perf_counter() - t0)
            run.collate_s = best
            scale = (batch_size or k) / k
    except Exception:
        run.where = "collate"
        run.error = traceback.format_exc(limit=-3)
        return run
    nbytes, count = _tensor_stats(batch)
    run.batch_bytes = int(nbytes * scale)
    run.tensors_per_batch = int(count * scale) if count >= k > 1 else count
    return run


def _confirmed_worst(subject: Subject, run: SampleRun) -> float:
    """The slowest sample's cost (first read excluded), confirmed by reading it again.

    A one-off stall (the scheduler, a page fault) is not the sample's cost: the slowest index
    is re-read ``TAIL_REREADS`` times and the fastest reading counts. Iterable datasets cannot
    be re-read; there the second slowest sample counts (a tail needs two).
    """
    times = run.times[1:]
    if subject.iterable or not run.keys:
        return sorted(times)[-2] if len(times) >= 2 else 0.0
    slot = max(range(len(times)), key=times.__getitem__)
    key = run.keys[slot + 1]
    best = times[slot]
    try:
        for _ in range(TAIL_REREADS):
            t0 = time.perf_counter()
            subject.dataset[key]
            best = min(best, time.perf_counter() - t0)
    except Exception:
        return best
    return best


def check_sampling(subject: Subject, run: SampleRun) -> list[Finding]:
    """SK409 (a sample or the collate failed), SK401 (latency tail), SK404 (collate share)."""
    findings: list[Finding] = []
    if run.error:
        last = run.error.strip().splitlines()[-1]
        findings.append(
            Finding(
                "SK409",
                Severity.ERROR,
                "Reading or collating a sample failed",
                f"at {run.where}: {last}",
                "The loader will raise the same error in a worker on its first batch.",
                "# run it in the main process to debug it:\nbatch = next(iter(DataLoader(ds, "
                "batch_size=2, num_workers=0)))",
                run.where,
            )
        )
    tail = run.times[1:]
    if len(tail) >= TAIL_MIN_SAMPLES - 1:
        median = statistics.median(tail)
        worst = _confirmed_worst(subject, run)
        if worst >= TAIL_MIN_S and worst >= TAIL_RATIO * median:
            findings.append(
                Finding(
                    "SK401",
                    Severity.WARNING,
                    "A heavy tail of per-sample latency",
                    f"{len(tail)} samples: median {median * 1e3:,.2f} ms, slowest "
                    f"{worst * 1e3:,.2f} ms ({worst / max(median, 1e-9):,.1f}x the median)",
                    "torch assigns batches to workers round-robin and delivers them in order: "
                    "one slow sample holds back its whole batch and every batch queued behind "
                    "it, so the GPU waits on the tail, not the median.",
                    "stoker.DataLoader(..., num_workers=4)  # any idle worker takes the next "
                    "batch\n# and if order does not matter:\nDataLoader(..., in_order=False)",
                    "dataset.__getitem__",
                )
            )
    if run.collate_s is not None and run.times:
        k = min(len(run.samples), subject.batch_size or COLLATE_MAX)
        reading = sum(run.times[:k])
        share = run.collate_s / max(reading + run.collate_s, 1e-12)
        if run.collate_s >= COLLATE_MIN_S and share >= COLLATE_SHARE:
            name = getattr(subject.collate_fn, "__qualname__", "default_collate")
            findings.append(
                Finding(
                    "SK404",
                    Severity.WARNING,
                    "`collate_fn` takes a large share of batch time",
                    f"`{name}` took {run.collate_s * 1e3:,.2f} ms for {k} samples that took "
                    f"{reading * 1e3:,.2f} ms to read: {share:.0%} of the batch's time",
                    "Collation runs once per batch in one worker; heavy per-batch Python work "
                    "there (loops over samples, conversions of lists) delays every batch.",
                    "# return tensors/arrays from __getitem__, do per-sample work there,\n"
                    "# and keep collate to stacking:\ndef collate(samples):\n"
                    "    xs, ys = zip(*samples)\n    return torch.stack(xs), torch.tensor(ys)",
                    "loader.collate_fn",
                )
            )
    return findings


def check_sample_types(subject: Subject, run: SampleRun) -> list[Finding]:
    """SK402 (PIL images in samples), SK403 (big Python lists in samples)."""
    if not run.samples:
        return []
    findings: list[Finding] = []
    pil = sys.modules.get("PIL.Image")
    for path, leaf in _leaves(run.samples[0]):
        if pil is not None and isinstance(leaf, pil.Image):
            default = subject.collate_fn is None and subject.batch_size is not None
            findings.append(
                Finding(
                    "SK402",
                    Severity.ERROR if default and subject.loader is not None else Severity.WARNING,
                    "Samples are PIL images",
                    f"`{path}` is a PIL image ({leaf.width}x{leaf.height} {leaf.mode})",
                    "torch's default collate cannot batch PIL images (TypeError), and a PIL "
                    "image travels from a worker by pickle, slower than a tensor or array, "
                    "which can go through shared memory as is.",
                    "import numpy as np, torch\n"
                    "x = torch.from_numpy(np.asarray(img)).permute(2, 0, 1)  # HWC uint8 -> CHW",
                    path,
                )
            )
            break
        if (
            isinstance(leaf, (list, tuple))
            and len(leaf) >= BIG_LIST
            and isinstance(leaf[0], (int, float))
        ):
            findings.append(
                Finding(
                    "SK403",
                    Severity.WARNING,
                    "Samples carry big Python lists of numbers",
                    f"`{path}` is a {type(leaf).__name__} of {len(leaf):,} "
                    f"{type(leaf[0]).__name__}s",
                    "Each number is a Python object to pickle; default collate turns a list of "
                    f"{len(leaf):,} numbers into {len(leaf):,} separate tensors per batch.",
                    "return torch.tensor(values)  # or np.asarray(values, dtype=np.float32)",
                    path,
                )
            )
            break
    return findings


def in_jupyter() -> bool:
    """True inside a Jupyter/IPython kernel."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return bool(get is not None and "ipykernel" in sys.modules and get() is not None)


def check_process(
    subject: Subject, *, daemonic: bool | None = None, jupyter: bool | None = None
) -> list[Finding]:
    """SK407 (in a daemonic process) and SK408 (Jupyter + spawn + objects from ``__main__``)."""
    findings: list[Finding] = []
    daemonic = multiprocessing.current_process().daemon if daemonic is None else daemonic
    jupyter = in_jupyter() if jupyter is None else jupyter
    if daemonic and subject.has_workers:
        findings.append(
            Finding(
                "SK407",
                Severity.ERROR,
                "Workers cannot start inside a daemonic process",
                f"this process ({multiprocessing.current_process().name}) is daemonic and the "
                f"loader wants {subject.num_workers} workers",
                "Python forbids daemonic processes to have children ('daemonic processes are "
                "not allowed to have children'); this happens when data loading runs inside a "
                "multiprocessing.Pool or a daemon Process.",
                "DataLoader(..., num_workers=0)  # inside the daemon\n"
                "# or start the outer process with daemon=False",
                "multiprocessing.current_process()",
            )
        )
    if jupyter and subject.has_workers and subject.start_method in ("spawn", "forkserver"):
        parts = [subject.dataset, subject.collate_fn, subject.worker_init_fn]
        owners = [
            getattr(p, "__qualname__", type(p).__qualname__)
            for p in parts
            if p is not None
            and (getattr(p, "__module__", None) or type(p).__module__) == "__main__"
        ]
        if owners:
            findings.append(
                Finding(
                    "SK408",
                    Severity.ERROR,
                    "Objects defined in a notebook cannot reach spawn/forkserver workers",
                    f"running in Jupyter with {subject.start_method!r}; defined in the notebook "
                    f"(__main__): {', '.join(owners)}",
                    "Workers import the pickled objects by module; a notebook's __main__ "
                    "cannot be imported, so workers fail with 'Can't get attribute ... on "
                    "<module '__main__'>'.",
                    "# move the Dataset class and functions to a .py file next to the notebook\n"
                    "from mydata import MyDataset",
                    "__main__",
                )
            )
    return findings
