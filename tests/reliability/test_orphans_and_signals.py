"""The main process dies or is interrupted: no orphans, no stale shared memory, no leaks.

Promises (issue 4): workers die within 5 s of the main process dying, even while blocked in
user code (parent-death signal, and a watcher that polls the parent: tested on its own by
starting the loader from a thread, where the parent-death signal is not used), and the pool's
shared memory is unlinked; a new run after a crash reclaims the stale pool of the crashed run
(and leaves a live pool alone, whatever pid its name carries); Ctrl-C gives
``KeyboardInterrupt`` within about a second, the workers go, and nothing warns about leaked
resources; SIGTERM leaves nothing behind.

Each case runs in a fresh interpreter (own session, faulthandler on) that the test signals.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from _faulty import BlockingDataset, SlowDataset, indices_of
from _isolate import (
    SHM_DIR,
    SHM_PREFIX,
    finish_interpreter,
    kill_all,
    read_line,
    run_case,
    shm_entries,
    start_interpreter,
    wait_gone,
)

import stoker

pytestmark = pytest.mark.timeout(120)

WORKERS = 2
# Promise: orphans gone within this many seconds of the main process's death.
ORPHAN_GRACE_S = 5.0
# Promise: about one second from Ctrl-C to KeyboardInterrupt; asserted generously.
INTERRUPT_WITHIN_S = 5.0
START_LIMIT_S = 60.0
EXIT_LIMIT_S = 30.0


# -- cases (fresh interpreters) --------------------------------------------------------------


def _announce_when_blocked(ready_dir: str, loader: Any) -> None:
    """Print the worker pids once every worker is blocked in ``__getitem__``."""
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        blocked = list(Path(ready_dir).glob("blocked-*"))
        if len(blocked) >= WORKERS:
            pids = [int(p.name.removeprefix("blocked-")) for p in blocked]
            print("PIDS", *pids, flush=True)
            return
        time.sleep(0.01)


def case_blocked_main(ready_dir: str, in_thread: bool) -> None:
    """Every worker blocks in ``__getitem__`` while the main process waits for a batch."""
    loader = stoker.DataLoader(
        BlockingDataset(100, range(100), ready_dir=ready_dir),
        batch_size=2,
        num_workers=WORKERS,
        multiprocessing_context="fork",
    )
    if in_thread:
        # Workers started from a thread get no parent-death signal (it would fire when the
        # thread ends): only the watcher that polls the parent can end them.
        threading.Thread(target=lambda: next(iter(loader)), daemon=True).start()
        _announce_when_blocked(ready_dir, loader)
        time.sleep(3600)
    else:
        threading.Thread(
            target=_announce_when_blocked, args=(ready_dir, loader), daemon=True
        ).start()
        next(iter(loader))


def case_interrupted(ready_dir: str, mode: str) -> None:
    """Iterate until interrupted; print when the interruption reached the training loop."""
    if mode == "blocked":
        dataset: Any = BlockingDataset(100, range(100), ready_dir=ready_dir)
    else:
        dataset = SlowDataset(10_000, 0.002)
    loader = stoker.DataLoader(
        dataset, batch_size=2, num_workers=WORKERS, multiprocessing_context="fork"
    )
    if mode == "blocked":
        threading.Thread(
            target=_announce_when_blocked, args=(ready_dir, loader), daemon=True
        ).start()
    try:
        for k, batch in enumerate(loader):
            indices_of([batch])
            if k == 3:
                pids = [w.pid for w in loader.stats().workers]
                print("PIDS", *pids, flush=True)
    finally:
        print("STOPPED", time.time(), sys.exc_info()[0].__name__, flush=True)


# -- helpers ---------------------------------------------------------------------------------


def _start(target: str, **kwargs: Any) -> tuple[subprocess.Popen[str], list[int]]:
    proc = start_interpreter(target, **kwargs)
    pids = [int(p) for p in read_line(proc, "PIDS", START_LIMIT_S).split()]
    assert len(pids) == WORKERS
    for pid in pids:
        assert psutil.Process(pid).ppid() == proc.pid, "not the child's workers"
    return proc, pids


def _cleanup(proc: subprocess.Popen[str], pids: list[int]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    kill_all(pids)
    with contextlib.suppress(Exception):
        proc.communicate(timeout=EXIT_LIMIT_S)
    for name in shm_entries(f"{SHM_PREFIX}{proc.pid}-"):
        path = os.path.join(SHM_DIR, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(path)


# -- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "started-in-a-thread"])
def test_main_killed_while_workers_block_leaves_no_orphans(in_thread: bool, tmp_path: Path) -> None:
    proc, pids = _start(
        "test_orphans_and_signals:case_blocked_main", ready_dir=str(tmp_path), in_thread=in_thread
    )
    try:
        assert shm_entries(f"{SHM_PREFIX}{proc.pid}-"), "the pool made no shared-memory files"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(EXIT_LIMIT_S)
        left, waited = wait_gone(pids, ORPHAN_GRACE_S)
        print(f"\nin_thread={in_thread}: workers gone {waited * 1000:.0f} ms after SIGKILL")
        assert not left, f"workers {left} outlived their killed parent by {ORPHAN_GRACE_S} s"
        stale = shm_entries(f"{SHM_PREFIX}{proc.pid}-")
        assert not stale, f"the dead run's shared memory was not unlinked: {sorted(stale)}"
    finally:
        _cleanup(proc, pids)


@pytest.mark.parametrize(
    ("mode", "to_group"),
    [("blocked", True), ("streaming", True), ("blocked", False)],
    ids=["blocked-ctrl-c", "streaming-ctrl-c", "blocked-sigint-to-main-only"],
)
def test_ctrl_c_interrupts_quickly_and_leaves_nothing(
    mode: str, to_group: bool, tmp_path: Path
) -> None:
    proc, pids = _start(
        "test_orphans_and_signals:case_interrupted", ready_dir=str(tmp_path), mode=mode
    )
    try:
        time.sleep(0.2)
        sent = time.time()
        if to_group:  # a terminal's Ctrl-C goes to the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        stopped = read_line(proc, "STOPPED", EXIT_LIMIT_S).split()
        latency = float(stopped[0]) - sent
        print(f"\n{mode}: KeyboardInterrupt {latency * 1000:.0f} ms after SIGINT")
        assert stopped[1] == "KeyboardInterrupt", stopped
        assert latency < INTERRUPT_WITHIN_S
        _, err = finish_interpreter(proc, EXIT_LIMIT_S)
        left, _ = wait_gone(pids, ORPHAN_GRACE_S)
        assert not left, f"workers {left} outlived the interrupted run"
        assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT, 1), proc.returncode
        assert "KeyboardInterrupt" in err
        tail = err.split("KeyboardInterrupt")[-1]
        for word in ("leaked", "Warning", "Exception ignored", "Traceback"):
            assert word not in tail, f"{word!r} on stderr after the interrupt:\n{err}"
        assert "leaked" not in err, err
        assert not shm_entries(f"{SHM_PREFIX}{proc.pid}-")
    finally:
        _cleanup(proc, pids)


def test_sigterm_to_main_leaves_no_workers_and_no_shared_memory(tmp_path: Path) -> None:
    proc, pids = _start(
        "test_orphans_and_signals:case_interrupted", ready_dir=str(tmp_path), mode="streaming"
    )
    try:
        os.kill(proc.pid, signal.SIGTERM)
        _, err = finish_interpreter(proc, EXIT_LIMIT_S)
        left, waited = wait_gone(pids, ORPHAN_GRACE_S)
        print(f"\nSIGTERM: workers gone {waited * 1000:.0f} ms after the main process exited")
        assert not left
        assert not shm_entries(f"{SHM_PREFIX}{proc.pid}-")
        assert "leaked" not in err, err
    finally:
        _cleanup(proc, pids)


# -- stale segments --------------------------------------------------------------------------


def case_new_run(n: int) -> dict[str, Any]:
    loader = stoker.DataLoader(
        SlowDataset(n, 0.0), batch_size=4, num_workers=WORKERS, multiprocessing_context="fork"
    )
    got = indices_of(loader)
    del loader
    return {"got": got}


# Holds a pool whose name carries a pid that is not its own (another pid namespace, or a pid
# reused since): liveness must come from the pool's lock, not from that pid.
_LIVE_HOLDER = """
import os, sys, time
from stoker.transport import PoolNamespace
ns = PoolNamespace.create(sys.argv[1])
path = os.path.join(sys.argv[1], "stoker-" + sys.argv[2] + "-livepool")
os.rename(ns.path, path)
print(path, flush=True)
time.sleep(120)
"""


def test_new_run_reclaims_the_pool_of_a_crashed_run_and_leaves_live_pools(
    tmp_path: Path,
) -> None:
    proc, pids = _start(
        "test_orphans_and_signals:case_blocked_main", ready_dir=str(tmp_path), in_thread=False
    )
    holder = None
    try:
        # A crash: the main process and its workers killed at once, before any cleanup.
        os.killpg(proc.pid, signal.SIGKILL)
        kill_all(pids)
        proc.wait(EXIT_LIMIT_S)
        assert not wait_gone(pids, ORPHAN_GRACE_S)[0]
        stale = shm_entries(f"{SHM_PREFIX}{proc.pid}-")
        assert stale, "the crashed run left no pool to reclaim"
        holder = subprocess.Popen(
            [sys.executable, "-c", _LIVE_HOLDER, SHM_DIR, str(proc.pid)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        live = Path(holder.stdout.readline().strip())
        assert live.is_dir(), live
        r = run_case(case_new_run, n=20).result
        assert r["got"] == list(range(20))
        left = shm_entries(f"{SHM_PREFIX}{proc.pid}-")
        mine = {n for n in left if not n.startswith(live.name)}
        assert live.name in left and not mine, (
            f"the crashed run's pool remains, or the live one went: {left}"
        )
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(EXIT_LIMIT_S)
            if holder.stdout is not None:
                holder.stdout.close()
        _cleanup(proc, pids)
