"""``backend="auto"``: a short measurement that picks thread or process workers.

It loads a few batches with one thread, timing wall and CPU time, then as many again with two
threads at once. Threads are chosen when loading mostly *waits* (storage, network: little CPU
for its wall time) and two threads run nearly twice as fast as one: then many threads hide the
waits without pickling, inter-process copies or per-worker copies of the dataset. Loading that
is mostly CPU work goes to processes, even when it releases the GIL (decoding): processes run
it in parallel just as well and never contend with the training loop for the GIL (measured:
threads reached 0.38x of processes on the bench's ``large`` workload, 0.75x on ``jpeg``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from stoker._platform import usable_cores

__all__ = ["choose_backend", "choose_backend_isolated"]

# Seconds the probe may spend, in all.
PROBE_BUDGET_S = 0.6
# Two threads must beat one by this factor for threads to be chosen.
THREAD_SPEEDUP = 1.6
# ... and at least this share of a batch's wall time must be waiting (not CPU).
THREAD_WAIT_SHARE = 0.5
# The parent gives the probing child this long before it kills it and picks processes.
PROBE_DEADLINE_S = 10.0
_MAX_BATCHES = 64


def _load(dataset: Any, fetch: Any, batches: list[list[int]]) -> None:
    for index in batches:
        fetch(index)


def choose_backend(dataset: Any, fetch: Any, batch_size: int, iterable: bool) -> tuple[str, str]:
    """Return ``(backend, why)``.

    Args:
        dataset: the dataset (map-style datasets are probed; iterable ones get processes).
        fetch: callable loading (and collating) one list of indices.
        batch_size: samples per probed batch.
        iterable: whether the dataset is an ``IterableDataset``.
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
    batch_of = [[(b * size + k) % n for k in range(size)] for b in range(_MAX_BATCHES)]
    # Serial: as many batches as fit in a third of the budget.
    t0, c0 = time.perf_counter(), time.thread_time()
    done = 0
    while done < _MAX_BATCHES // 2 and time.perf_counter() - t0 < PROBE_BUDGET_S / 3:
        fetch(batch_of[done])
        done += 1
    serial = (time.perf_counter() - t0) / done
    waiting = max(0.0, 1.0 - (time.thread_time() - c0) / done / max(serial, 1e-9))
    # Two threads, the same number of batches each.
    halves = [batch_of[done : 2 * done], batch_of[done : 2 * done]]
    threads = [threading.Thread(target=_load, args=(dataset, fetch, h)) for h in halves]
    t1 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = (time.perf_counter() - t1) / (2 * done)
    speedup = serial / max(parallel, 1e-9)
    if waiting < THREAD_WAIT_SHARE:
        return "process", (
            f"loading is CPU work ({1 - waiting:.0%} of its time): processes run it in parallel "
            "without contending with the training loop for the GIL"
        )
    if speedup >= THREAD_SPEEDUP:
        return "thread", (
            f"loading mostly waits ({waiting:.0%} of its time) and two threads loaded "
            f"{speedup:.1f}x as fast as one: threads hide the waits without pickling or copying"
        )
    return "process", (
        f"two threads loaded only {speedup:.1f}x as fast as one: loading holds the GIL, so it "
        "needs processes"
    )


def choose_backend_isolated(
    dataset: Any, fetch: Any, batch_size: int, iterable: bool
) -> tuple[str, str]:
    """:func:`choose_backend` in a forked child, so the probe's reads leave no trace here.

    A dataset that opens files lazily would otherwise open them in this process, and forked
    workers would inherit the handles (unsafe for h5py, LMDB, sockets).
    """
    import os
    import pickle

    if iterable or not hasattr(os, "fork"):
        return choose_backend(dataset, fetch, batch_size, iterable)
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
            result = choose_backend(dataset, fetch, batch_size, iterable)
            os.write(w, pickle.dumps(result))
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
    import time

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
        backend, why = pickle.loads(b"".join(chunks))
    except Exception:
        return "process", "backend probe failed; using processes"
    return str(backend), str(why)
