"""``backend="auto"``: a short measurement that picks inline, thread or process loading.

It runs in a forked child (a copy of the process, as a worker would be) and loads samples one
at a time, timing wall and CPU time of each and collating them into batches, and measures how
many private bytes reading them copied (copy-on-read of Python objects); then, where samples
wait or the dataset would be copied (elsewhere the answer is processes whatever threads do), it
loads as many other samples with two threads at once. Then:

* **threads** when the typical sample mostly *waits* (storage, network: the median sample
  uses little CPU for its wall time) and two threads load nearly twice as fast as one: many
  threads hide the waits without pickling, inter-process copies or per-worker copies of the
  dataset. The median, not the mean, so that a rare slow sample (a heavy tail) does not pass
  for I/O;
* **threads** too when a few slow samples wait for a large share of the loading time (a heavy
  tail) and the work between the waits runs in parallel in threads: covering those waits takes
  more workers than cores, and threads cost no process each (measured on the bench's
  ``heavytail``: 8 threads 1,431 samples/s against tune's 6 processes 1,278, alternately,
  with the memory of the main process alone). Two threads loading faster than one does not
  show that: overlapping the waits alone speeds them up, GIL or not. So enough threads load at
  once to keep three cores busy were the work free of the GIL, and the cores they kept busy
  tell: more than one, and they ran in parallel (on a machine whose other processes leave
  this one a core or less, threads are not chosen);
* **inline** (``num_workers="auto"`` only) when a whole batch loads faster than the main
  process would take to receive it from a worker, or when forked workers would copy the
  dataset as they read it and threads would not run the work in parallel either: loading in
  the main process then costs less and copies nothing;
* **threads** when forked workers would copy the dataset and the work runs in parallel in
  threads (it releases the GIL);
* **processes** otherwise: CPU work, even GIL-free work such as decoding, runs in parallel in
  processes just as well and never contends with the training loop for the GIL (measured:
  threads reached 0.38x of processes on the bench's ``large`` workload, 0.75x on ``jpeg``).
"""

from __future__ import annotations

import gc
import itertools
import math
import statistics
import threading
import time
from typing import Any

from stoker._introspect.containers import find_containers
from stoker._introspect.platform import usable_cores

__all__ = ["COW_BYTES_PER_SAMPLE", "INLINE_BATCH_S", "choose_backend", "choose_backend_isolated"]

# Seconds the probe may spend, in all (the serial pass gets a third, the two threads the rest).
PROBE_BUDGET_S = 0.6
# Most rounds of one thread against two (cheap samples leave budget for more than one).
PROBE_ROUNDS = 3
# Two threads must beat one by this factor for threads to be chosen.
THREAD_SPEEDUP = 1.6
# ... and the median sample must spend at least this share of its wall time waiting,
THREAD_WAIT_SHARE = 0.5
# ... or the serial pass at least this share of its whole wall time (slow samples that wait),
TAIL_WAIT_SHARE = 0.25
# ... and threads enough to keep three cores busy, were the work free of the GIL, must have
# kept at least this many busy on average (GIL-bound threads keep at most one busy: measured
# 1.00-1.02 on a GIL-bound tail, 1.70-1.99 on a numpy one, 2 cores).
TAIL_PARALLEL_CORES = 1.3
# Most threads that pass may use, and how long it measures.
TAIL_MAX_THREADS = 8
TAIL_WINDOW_S = 0.15
# A batch that loads in less than this is cheaper to load in the main process than to receive
# from a worker (measured: receiving costs the main process 0.35-0.40 ms of CPU per batch on
# a 2.5 GHz Xeon, for small batches).
INLINE_BATCH_S = 0.3e-3
# Private bytes per sample read above which forked workers are said to copy the dataset
# (a Python object read in a random order dirties about one 4 KiB page).
COW_BYTES_PER_SAMPLE = 1024
# ... and the dataset must hold at least this much in Python containers (estimated).
COW_CONTAINER_BYTES = 16 * 2**20
# The parent gives the probing child this long before it kills it and picks processes.
PROBE_DEADLINE_S = 10.0
# Most samples the serial pass loads.
_MAX_SAMPLES = 4096
# Indices are spread over the dataset with this stride (coprime with any length that is not
# a multiple of it), so that the probe reads as a shuffled epoch does, not one region.
_STRIDE = 2_654_435_761


def shared_dirty_bytes() -> int | None:
    """Dirty pages this process still shares (after a fork: with its parent), from
    ``/proc/self/smaps_rollup``; None where that file does not exist.

    A forked child that writes to an inherited page gets a private copy of it, and the page
    leaves this count, while fresh allocations never enter it: its decrease is what the child
    copied, whatever else it allocated meanwhile.
    """
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Shared_Dirty:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _load(dataset: Any, indices: list[int], walls: list[float]) -> None:
    for i in indices:
        t0 = time.perf_counter()
        dataset[i]
        walls.append(time.perf_counter() - t0)


def _fresh(n: int, start: int, count: int) -> list[int]:
    """``count`` indices spread over a dataset of ``n`` samples, from stride step ``start``."""
    return [(k * _STRIDE) % n for k in range(start, start + count)]


def _two_threads(dataset: Any, indices: list[int]) -> tuple[list[float], float]:
    """Load ``indices`` in two threads, half each; return each sample's wall time and the
    pass's wall time."""
    half = len(indices) // 2 or 1
    parts = [indices[:half], indices[half:]] if len(indices) > 1 else [indices]
    walls: list[list[float]] = [[] for _ in parts]
    threads = [
        threading.Thread(target=_load, args=(dataset, part, out))
        for part, out in zip(parts, walls, strict=True)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [w for part in walls for w in part], max(time.perf_counter() - t0, 1e-9)


def _thread_speedup(
    dataset: Any, n: int, walls: list[float], start: int, t0: float, budget_s: float
) -> tuple[float, int]:
    """How much faster two threads load than one, and the next fresh stride step.

    ``walls`` are the serial pass's sample times (begun at ``t0``); the threads load as many
    other samples, from stride step ``start``, as cold as the serial pass's.
    """
    loaded, serial = len(walls), sum(walls)
    parallel_walls, wall2 = _two_threads(dataset, _fresh(n, start, loaded))
    start += loaded
    # Cheap samples leave budget over: more rounds of one thread against two, on fresh samples,
    # and the quickest of each counts, so that one preemption of a pass lasting milliseconds
    # does not decide (a 5 ms stall made a GIL-bound serial pass look 1.8x slower than two
    # threads taking turns).
    one_best, two_best = serial, wall2
    for _ in range(PROBE_ROUNDS - 1):
        if time.perf_counter() - t0 + 2 * (one_best + two_best) > budget_s:
            break
        fresh = _fresh(n, start, 2 * loaded)
        start += 2 * loaded
        w1 = time.perf_counter()
        _load(dataset, fresh[:loaded], [])
        one_best = min(one_best, time.perf_counter() - w1)
        two_best = min(two_best, _two_threads(dataset, fresh[loaded:])[1])
    # Two threads that run in parallel load each sample as fast as one thread alone; two that
    # take turns, half as fast. By the median sample, so that a rare slow sample does not
    # decide, and by the total, which shows turn-taking on samples shorter than the
    # interpreter's switch interval: the lower of the two.
    per_sample = max(statistics.median(parallel_walls), 1e-9)
    by_median = 2 * statistics.median(walls) / per_sample if loaded > 1 else 1.0
    return min(by_median, one_best / two_best), start


def _busy_cores(
    dataset: Any, n: int, start: int, count: int, seconds: float, join: bool = True
) -> float:
    """Cores that ``count`` threads loading fresh samples kept busy on average over
    ``seconds``: process CPU time over wall time, while every thread was still loading.

    A thread waiting for the GIL sleeps, so GIL-bound threads keep at most one core busy
    however many there are. ``join=False`` leaves the threads to finish their samples
    unwaited (in the probe's forked child, which exits after answering: waiting for the
    slowest sample in flight added 0.15 s to the bench's heavytail probe).
    """
    stop = threading.Event()
    ks = itertools.count(start)

    def load() -> None:
        while not stop.is_set():
            dataset[(next(ks) * _STRIDE) % n]  # next() on a count is atomic under the GIL

    threads = [threading.Thread(target=load, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    c0, w0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cores = (time.process_time() - c0) / max(time.perf_counter() - w0, 1e-9)
    stop.set()
    for t in threads if join else ():
        t.join()
    return cores


def _holds_python_objects(dataset: Any) -> bool:
    """Whether the dataset holds large containers of Python objects (copy-on-read suspects).

    A forked child also copies free heap memory its parent left, as it allocates: measured
    copying is blamed on the dataset only when the dataset holds something to copy.
    """
    try:
        return sum(c.bytes for c in find_containers(dataset)) >= COW_CONTAINER_BYTES
    except Exception:
        return False


def choose_backend(
    dataset: Any,
    collate_fn: Any,
    batch_size: int,
    iterable: bool,
    *,
    allow_inline: bool = True,
    forked: bool = False,
    budget_s: float = PROBE_BUDGET_S,
    detail: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """Return ``(backend, why)``: ``"inline"``, ``"thread"`` or ``"process"``.

    Args:
        dataset: the dataset (map-style datasets are probed; iterable ones get processes).
        collate_fn: the loader's collate function (batches are collated as the loader would).
        batch_size: samples per batch.
        iterable: whether the dataset is an ``IterableDataset``.
        allow_inline: whether loading in the main process is an option (``num_workers="auto"``).
        forked: whether this runs in a forked child whose inherited objects are frozen
            (``gc.freeze``): only then does its private-memory growth measure copy-on-read.
        budget_s: seconds the probe may spend.
        detail: if given, ``detail["waits"]`` is set to True when threads were chosen to
            cover waits (not to share a dataset processes would copy): processes do as well
            there, and better while the training loop holds the GIL; and
            ``detail["wait_share"]`` to the share of the serial pass's loading time spent
            waiting (off the CPU), ``detail["batch_s"]`` to the seconds a batch took to load
            in it and ``detail["copies"]`` to whether forked workers would copy the dataset,
            once measured.
    """
    if iterable:
        return "process", "iterable dataset: each worker needs its own stream (processes)"
    if usable_cores() < 2:
        return "process", "one usable core: threads cannot run in parallel"
    try:
        n = len(dataset)
    except TypeError:
        return "process", "dataset has no len(): cannot probe"
    if n == 0:
        return "process", "empty dataset"
    size = max(1, batch_size)
    order = [(k * _STRIDE) % n for k in range(min(n, _MAX_SAMPLES))]
    for i in order[: min(len(order), 2)]:  # warm-up: first-use costs are not the dataset's
        collate_fn([dataset[i]])
    shared0 = shared_dirty_bytes() if forked else None
    walls: list[float] = []
    cpus: list[float] = []
    collate_s = 0.0
    batch: list[Any] = []
    # Process CPU time: it includes the intra-op threads a sample's torch ops may use (in
    # the forked child nothing else runs).
    t0 = time.perf_counter()
    half: tuple[int, int | None] | None = None  # (samples, shared bytes) halfway
    while len(walls) < len(order) and (
        time.perf_counter() - t0 < budget_s / 3
        # a few samples at least, unless they are so slow that the deadline nears
        or (len(walls) < min(size, 8) and time.perf_counter() - t0 < PROBE_DEADLINE_S / 4)
    ):
        if half is None and time.perf_counter() - t0 >= budget_s / 6:
            half = (len(walls), shared_dirty_bytes() if forked else None)
        # The wall clock inside the CPU clock: reading the CPU clock is a system call that
        # costs about as much as a cheap sample, and the threaded pass below reads only walls.
        c0 = time.process_time()
        w0 = time.perf_counter()
        sample = dataset[order[len(walls)]]
        w1 = time.perf_counter()
        cpus.append(time.process_time() - c0)
        walls.append(w1 - w0)
        batch.append(sample)
        if len(batch) == size:
            c1 = time.perf_counter()
            collate_fn(batch)
            collate_s += time.perf_counter() - c1
            batch = []
    if batch:
        c1 = time.perf_counter()
        collate_fn(batch)
        collate_s += time.perf_counter() - c1
    shared1 = shared_dirty_bytes() if forked else None
    loaded = len(walls)
    serial = sum(walls)
    # Copies in the second half only: the first samples also write to free heap memory the
    # parent left (a bounded, one-off copy); reading a dataset's objects keeps copying.
    start, shared_half = half if half is not None and half[0] < loaded else (0, shared0)
    copied = (
        max(0, shared_half - shared1) / (loaded - start)
        if shared_half is not None and shared1 is not None
        else 0.0
    )
    batch_s = (serial + collate_s) / loaded * size
    waiting = statistics.median(
        max(0.0, 1.0 - c / w) if w > 0 else 0.0 for c, w in zip(cpus, walls, strict=True)
    )
    waiting_all = max(0.0, 1.0 - sum(cpus) / serial) if serial > 0 else 0.0
    cow = copied >= COW_BYTES_PER_SAMPLE and _holds_python_objects(dataset)
    if detail is not None:
        detail.update(wait_share=waiting_all, batch_s=batch_s, copies=cow)
    next_index = len(order) + loaded
    speedup = 0.0
    # How two threads fare matters only to samples that wait and to datasets that forked
    # workers would copy: CPU work goes to processes whatever it is (the rounds would take
    # the rest of the budget, hundreds of milliseconds before the first worker starts).
    if waiting >= THREAD_WAIT_SHARE or cow:
        speedup, next_index = _thread_speedup(dataset, n, walls, next_index, t0, budget_s)
    parallel = speedup >= THREAD_SPEEDUP
    if waiting >= THREAD_WAIT_SHARE and parallel:
        if detail is not None:
            detail["waits"] = True
        return "thread", (
            f"loading mostly waits (the median sample waits {waiting:.0%} of its time) and two "
            f"threads loaded {speedup:.1f}x as fast as one: threads hide the waits without "
            "pickling or copying"
        )
    if waiting_all >= TAIL_WAIT_SHARE:
        # Overlapped waits alone make two threads up to 1 / (1 - waiting_all) times as fast as
        # one, GIL or not: whether the work between them runs in parallel shows in the cores
        # that threads enough to fill three of them, were it GIL-free, keep busy.
        count = min(TAIL_MAX_THREADS, max(2, math.ceil(3 / max(1.0 - waiting_all, 1e-3))))
        cores = _busy_cores(dataset, n, next_index, count, TAIL_WINDOW_S, join=not forked)
        if cores >= TAIL_PARALLEL_CORES:
            if detail is not None:
                detail["waits"] = True
            return "thread", (
                f"a few slow samples wait ({waiting_all:.0%} of the loading time waits, the "
                f"median sample {waiting:.0%}) and {count} threads kept {cores:.1f} cores busy: "
                "covering the waits takes more workers than cores, and threads cost no process "
                "each"
            )
    if allow_inline and batch_s < INLINE_BATCH_S:
        return "inline", (
            f"a batch loads in {batch_s * 1e3:.2f} ms: less than receiving it from a worker "
            "would cost the main process, so it loads there"
        )
    if cow:
        cow_why = (
            f"forked workers would copy the dataset as they read it ({copied / 1024:,.1f} KiB "
            "per sample measured; `stoker.compact` or numpy arrays let processes share it)"
        )
        if parallel:
            return "thread", (
                f"{cow_why}; two threads loaded {speedup:.1f}x as fast as one: threads"
            )
        if allow_inline:
            return "inline", (
                f"{cow_why}; two threads loaded only {speedup:.1f}x as fast as one (the work "
                f"holds the GIL); a batch loads in {batch_s * 1e3:.2f} ms: loading in the main "
                "process"
            )
        return "thread", f"{cow_why}: threads share it"
    if waiting < THREAD_WAIT_SHARE:
        return "process", (
            f"loading is CPU work (the median sample computes {1 - waiting:.0%} of its time): "
            "processes run it in parallel without contending with the training loop for the GIL"
        )
    return "process", (
        f"two threads loaded only {speedup:.1f}x as fast as one: loading holds the GIL, so it "
        "needs processes"
    )


def choose_backend_isolated(
    dataset: Any,
    collate_fn: Any,
    batch_size: int,
    iterable: bool,
    *,
    allow_inline: bool = True,
    detail: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """:func:`choose_backend` in a forked child, so the probe's reads leave no trace here.

    A dataset that opens files lazily would otherwise open them in this process, and forked
    workers would inherit the handles (unsafe for h5py, LMDB, sockets).
    """
    import os
    import pickle

    if iterable or not hasattr(os, "fork"):
        return choose_backend(
            dataset, collate_fn, batch_size, iterable, allow_inline=allow_inline, detail=detail
        )
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.close(r)
            # A forked child must not use the OpenMP pool its parent used (libgomp is not
            # fork-safe: it would wait forever); workers do the same.
            import torch

            torch.set_num_threads(1)
            # As workers do: a garbage collection must not count as copying the dataset.
            gc.freeze()
            probed: dict[str, Any] = {}
            result = choose_backend(
                dataset,
                collate_fn,
                batch_size,
                iterable,
                allow_inline=allow_inline,
                forked=True,
                detail=probed,
            )
            os.write(w, pickle.dumps((*result, probed)))
        except BaseException as exc:
            try:
                os.write(w, pickle.dumps(("process", f"probe failed: {exc!r:.200}")))
            except BaseException:
                code = 1
        finally:
            os._exit(code)
    os.close(w)
    import select
    import signal

    chunks: list[bytes] = []
    deadline = time.monotonic() + PROBE_DEADLINE_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                chunks = []
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    if not chunks:
        return "process", f"the backend probe gave no answer within {PROBE_DEADLINE_S:.0f} s"
    try:
        backend, why, *found = pickle.loads(b"".join(chunks))
    except Exception:
        return "process", "backend probe failed; using processes"
    if detail is not None and found and isinstance(found[0], dict):
        detail.update(found[0])
    return str(backend), str(why)
