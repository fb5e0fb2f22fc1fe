"""Resource limits: many create-and-break cycles, few file descriptors, the shm directory.

Promises (issue 4): 50 loaders created and broken in every way (early ``break``, an error in
``__getitem__``, a worker killed, a timeout) leave the fd count, the ``/dev/shm`` entries and
the process count flat; 500 batches run under ``RLIMIT_NOFILE=64``; a shared-memory directory
that is too small or unusable gives a clear ``stoker.SharedMemoryError`` before any SIGBUS,
naming the needed and free bytes and the fix.

Gap, written down: this machine cannot mount a small tmpfs, so the *real* "directory full"
path (``posix_fallocate`` failing with ENOSPC on a full tmpfs) is exercised by making
``os.posix_fallocate`` in the case's process tree answer ENOSPC, as a full tmpfs does; the
rest (``STOKER_SHM_DIR`` moving the pool, a missing directory) uses real directories.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import re
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest
from _faulty import BlockingDataset, FailingDataset, RandomDataset, SampleError, indices_of
from _isolate import (
    SHM_DIR,
    SHM_PREFIX,
    fd_count,
    finish_interpreter,
    run_case,
    shm_entries,
    start_interpreter,
)

import stoker

pytestmark = pytest.mark.timeout(180)

CYCLES = 50
NOFILE = 64
NOFILE_BATCHES = 500


# -- create and break ------------------------------------------------------------------------


# The error each way of breaking a loader (``k % 5``) must raise; ``None``: it raises nothing.
EXPECTED_RAISE: tuple[str | None, ...] = (
    None,
    None,
    "SampleError",
    "WorkerError",
    "WorkerTimeoutError",
)


def _one_cycle(k: int, ready_dir: str) -> str | None:
    """Create and break one loader the ``k % 5``-th way; return the name of the exception type
    that breaking it raised (``None`` if none), for the test to check against
    ``EXPECTED_RAISE``."""
    how = k % 5
    raised: str | None = None
    kwargs: dict[str, Any] = {
        "batch_size": 2,
        "num_workers": 2,
        "multiprocessing_context": "fork",
    }
    if how == 0:  # early break, loader dropped
        loader = stoker.DataLoader(RandomDataset(40), **kwargs)
        for i, _ in enumerate(loader):
            if i == 2:
                break
    elif how == 1:  # early break, then the iterator dropped, then a second epoch broken
        loader = stoker.DataLoader(RandomDataset(40), persistent_workers=False, **kwargs)
        for _ in range(2):
            it = iter(loader)
            next(it)
            del it
    elif how == 2:  # an exception from __getitem__
        loader = stoker.DataLoader(FailingDataset(40, [5]), **kwargs)
        try:
            indices_of(loader)
        except SampleError as exc:
            raised = type(exc).__name__
    elif how == 3:  # the workers killed, no restarts
        loader = stoker.DataLoader(RandomDataset(400), **kwargs)
        try:
            for i, _ in enumerate(loader):
                if i == 1:
                    # Every worker: one killed between batches holds none, and the other
                    # could load the rest of the epoch without the death being noticed.
                    for worker in loader.stats().workers:
                        assert worker.pid is not None
                        os.kill(worker.pid, signal.SIGKILL)
        except stoker.WorkerError as exc:
            raised = type(exc).__name__
    else:  # a timeout on a hung worker
        loader = stoker.DataLoader(
            BlockingDataset(40, [7], ready_dir=ready_dir), timeout=0.3, **kwargs
        )
        try:
            indices_of(loader)
        except stoker.WorkerTimeoutError as exc:
            raised = type(exc).__name__
    del loader
    return raised


def _snapshot() -> tuple[int, int, int]:
    """(fds, this process's shm entries, child processes), once the children have exited.

    No ``gc.collect()`` unless something is still running: a loader must be cleaned up when
    its last reference goes, not when the collector happens to run.
    """
    me = psutil.Process()
    deadline = time.monotonic() + 5.0
    while me.children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.01)
        if time.monotonic() > deadline - 4.0:
            gc.collect()
    return fd_count(), len(shm_entries(f"{SHM_PREFIX}{os.getpid()}-")), len(me.children())


def case_cycles(ready_dir: str) -> dict[str, Any]:
    import stoker.workers._process as process

    # Most cycles end with workers that exit at once; the hung one needs SIGTERM anyway.
    process.STOP_GRACE_S = 0.2
    process.TERM_GRACE_S = 0.2
    warnings.simplefilter("ignore")
    before = _snapshot()
    after: list[tuple[int, int, int]] = []
    raised: list[str | None] = []
    for k in range(CYCLES):
        raised.append(_one_cycle(k, ready_dir))
        after.append(_snapshot())
    return {"before": before, "after": after, "raised": raised}


def test_fifty_create_and_break_cycles_leave_nothing(tmp_path: Path) -> None:
    r = run_case(case_cycles, ready_dir=str(tmp_path), limit_s=170).result
    before, after = r["before"], r["after"]
    # Each cycle broke its loader the way it meant to: a cycle whose error never came
    # would test a loader that was not broken.
    expected = [EXPECTED_RAISE[k % 5] for k in range(CYCLES)]
    assert r["raised"] == expected
    fds = [a[0] for a in after]
    print(f"\nfds before {before[0]}, after cycles: min {min(fds)} max {max(fds)}")
    # Flat: the last cycle ends where the first did, and no cycle leaves more than the first.
    assert after[-1] == after[0], (before, after[0], after[-1])
    assert max(fds) == fds[0], fds
    assert all(a[1] == 0 for a in after), [a[1] for a in after]
    assert all(a[2] == 0 for a in after), [a[2] for a in after]
    assert fds[0] <= before[0] + 2, (before, after[0])


# -- few file descriptors --------------------------------------------------------------------


def case_nofile() -> dict[str, Any]:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))
    loader = stoker.DataLoader(
        RandomDataset(NOFILE_BATCHES * 2 // 5),
        batch_size=2,
        num_workers=2,
        multiprocessing_context="fork",
    )
    got: list[int] = []
    kept = []
    batches = 0
    while batches < NOFILE_BATCHES:
        for batch in loader:
            got.extend(indices_of([batch]))
            if batches % 50 == 0:
                kept.append(batch)  # batches the user keeps hold slots
            batches += 1
            if batches == NOFILE_BATCHES:
                break
    fds = len(os.listdir("/proc/self/fd"))
    del loader, kept
    return {"batches": batches, "samples": len(got), "fds_at_end": fds, "limit": NOFILE}


def test_five_hundred_batches_under_rlimit_nofile_64() -> None:
    proc = start_interpreter("test_limits:case_nofile")
    out, err = finish_interpreter(proc, 150)
    assert proc.returncode == 0, err[-6000:]
    line = [x for x in out.splitlines() if x.startswith("CASE-RESULT ")][-1]
    r = json.loads(line.removeprefix("CASE-RESULT "))
    print(
        f"\nRLIMIT_NOFILE={NOFILE}: {r['batches']} batches, {r['fds_at_end']} fds open at the end"
    )
    assert r["batches"] == NOFILE_BATCHES
    assert r["samples"] == 2 * NOFILE_BATCHES
    assert r["fds_at_end"] < NOFILE
    assert not r["_leftover_children"] and not r["_leftover_shm"]
    assert not shm_entries(f"{SHM_PREFIX}{proc.pid}-")


# -- the shared-memory directory -------------------------------------------------------------


def case_in_dir(directory: str) -> dict[str, Any]:
    os.environ["STOKER_SHM_DIR"] = directory
    loader = stoker.DataLoader(
        RandomDataset(40), batch_size=4, num_workers=2, multiprocessing_context="fork"
    )
    seen_during: set[str] = set()
    got: list[int] = []
    error: dict[str, Any] = {}
    try:
        for batch in loader:
            got.extend(indices_of([batch]))
            seen_during |= shm_entries(f"{SHM_PREFIX}{os.getpid()}-", directory)
    except BaseException as exc:
        error = {
            "mro": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
            "notes": list(getattr(exc, "__notes__", [])),
        }
    in_dev_shm = shm_entries(f"{SHM_PREFIX}{os.getpid()}-")
    del loader
    gc.collect()
    return {
        "got": got,
        "error": error,
        "seen_during": sorted(seen_during),
        "in_dev_shm": sorted(in_dev_shm),
        "left_in_dir": sorted(shm_entries(f"{SHM_PREFIX}{os.getpid()}-", directory)),
    }


def test_stoker_shm_dir_moves_the_pool_and_is_cleaned(tmp_path: Path) -> None:
    r = run_case(case_in_dir, directory=str(tmp_path)).result
    assert r["error"] == {}
    assert r["got"] == list(range(40))
    assert any("-w" in name for name in r["seen_during"]), r["seen_during"]
    assert r["in_dev_shm"] == [], "slots went to /dev/shm despite STOKER_SHM_DIR"
    assert r["left_in_dir"] == []


def test_missing_shm_dir_is_a_clear_shared_memory_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    r = run_case(case_in_dir, directory=str(missing)).result
    err = r["error"]
    assert err, "a loader ran with its shared-memory directory missing"
    assert "SharedMemoryError" in err["mro"] and "StokerError" in err["mro"], err
    assert str(missing) in err["message"], err["message"]
    assert "STOKER_SHM_DIR" in err["message"], err["message"]


def case_full_dir(batch_bytes: int, shm: str = "require") -> dict[str, Any]:
    """A shm directory that is full: ``posix_fallocate`` answers ENOSPC as a full tmpfs does."""

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    os.posix_fallocate = full  # inherited by the forked workers
    import numpy as np

    class Big(RandomDataset):
        def __getitem__(self, i: int) -> Any:
            return i, np.zeros(batch_bytes // 4, dtype=np.uint8)

    return _run_big(Big(40), shm)


def _run_big(dataset: Any, shm: str) -> dict[str, Any]:
    loader = stoker.DataLoader(
        dataset, batch_size=4, num_workers=2, multiprocessing_context="fork", shm=shm
    )
    got: list[int] = []
    error: dict[str, Any] = {}
    try:
        for batch in loader:
            got.extend(indices_of([batch]))
    except BaseException as exc:
        error = {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    del loader
    return {"got": got, "error": error}


def test_full_shm_dir_is_a_clear_error_not_a_sigbus() -> None:
    batch_bytes = 1 << 20
    r = run_case(case_full_dir, batch_bytes=batch_bytes).result
    err = r["error"]
    assert err, "batches were delivered although no slot could be allocated"
    assert "SharedMemoryError" in err["mro"], err
    message = err["message"]
    assert "SIGBUS" not in message
    assert SHM_DIR in message and "free" in message, message
    assert "--shm-size" in message and "STOKER_SHM_DIR" in message, message
    # The space needed is named, in MiB (at least the batch's size).
    needs = re.search(r"needs (\d+\.\d) MiB", message)
    assert needs is not None and float(needs.group(1)) * (1 << 20) >= batch_bytes, message


def test_full_shm_dir_by_default_sends_every_batch_through_the_pipe() -> None:
    r = run_case(case_full_dir, batch_bytes=1 << 20, shm="auto").result
    assert r["error"] == {}, r["error"]
    assert sorted(r["got"]) == list(range(40))
