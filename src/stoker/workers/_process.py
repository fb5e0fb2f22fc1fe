"""Starting, feeding and stopping worker processes (fork, forkserver or spawn).

Pipes::

    main --(shared task pipe, read under a lock)--> any idle worker    map-style batches
    main --(one control pipe per worker)----------> worker i           epochs, iterable tasks, stop
    worker i --(one result pipe per worker)-------> main               data headers, errors

Under fork the dataset, ``collate_fn`` and ``worker_init_fn`` are inherited; under spawn and
forkserver they are serialised once with cloudpickle (lambdas and classes defined in
``__main__`` or a notebook work) and reused for every worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import multiprocessing.connection as mpc
import os
import signal
import time
from typing import Any

import cloudpickle

from stoker.transport import unlink_owned
from stoker.workers._loop import WorkerSpec, worker_main

__all__ = ["WorkerPool", "describe_exit"]

# Seconds a worker gets to exit after being asked, then after SIGTERM, before SIGKILL.
STOP_GRACE_S = 1.0
TERM_GRACE_S = 0.5
# Pipes are enlarged to this size (Linux) so that queued tasks never block the main process.
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031

_LIKELY_CAUSE = {
    signal.SIGKILL: "possibly killed by the kernel's out-of-memory killer (check `dmesg`)",
    signal.SIGBUS: "possibly the shared-memory directory filled up (check `df -h /dev/shm`)",
    signal.SIGSEGV: "a segmentation fault in native code called by the dataset",
    signal.SIGTERM: "terminated by another process",
}


def describe_exit(exitcode: int | None) -> str:
    """Human description of a worker's exit code (negative: killed by a signal)."""
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
        except ValueError:
            return f"signal {-exitcode}"
        cause = _LIKELY_CAUSE.get(sig)
        return f"signal {sig.name}" + (f": {cause}" if cause else "")
    return f"exit code {exitcode}"


def _enlarge(conn: Any) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)


class WorkerPool:
    """A fixed set of worker processes and their pipes.

    Args:
        ctx: multiprocessing context (decides the start method).
        specs: one :class:`WorkerSpec` per worker.
        payload: ``(dataset, collate_fn, worker_init_fn)``.
    """

    def __init__(self, ctx: Any, specs: list[WorkerSpec], payload: tuple[Any, ...]) -> None:
        self._ctx = ctx
        self.start_method: str = ctx.get_start_method()
        self.slot_prefix = specs[0].slot_prefix if specs else ""
        self.task_reader, self.task_writer = ctx.Pipe(duplex=False)
        _enlarge(self.task_writer)
        self.task_lock = ctx.Lock()
        self._payload: Any = payload if self.start_method == "fork" else cloudpickle.dumps(payload)
        self.specs = specs
        self.processes: list[Any] = []
        self.ctrl: list[Any] = []
        self.results: list[Any] = []
        self.closed = False
        frozen = self.start_method == "fork"
        if frozen:
            # Objects moved to the permanent generation are never touched by the collector,
            # so forked workers do not copy the pages that hold them.
            gc.freeze()
        try:
            for spec in specs:
                self._start(spec)
        except BaseException:
            self.shutdown()
            raise
        finally:
            if frozen:
                gc.unfreeze()

    def _start(self, spec: WorkerSpec) -> None:
        ctrl_r, ctrl_w = self._ctx.Pipe(duplex=False)
        res_r, res_w = self._ctx.Pipe(duplex=False)
        _enlarge(ctrl_w)
        _enlarge(res_w)
        proc = self._ctx.Process(
            target=worker_main,
            args=(spec, self._payload, self.task_reader, self.task_lock, ctrl_r, res_w),
            name=f"stoker-worker-{spec.worker_id}",
            daemon=True,
        )
        proc.start()
        ctrl_r.close()
        res_w.close()
        self.processes.append(proc)
        self.ctrl.append(ctrl_w)
        self.results.append(res_r)

    # -- traffic -------------------------------------------------------------------------

    def put_task(self, data: bytes) -> None:
        self.task_writer.send_bytes(data)

    def send_ctrl(self, worker_id: int, data: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.ctrl[worker_id].send_bytes(data)

    def drain_tasks(self) -> int:
        """Remove tasks no worker has taken yet; returns how many."""
        count = 0
        with self.task_lock:
            while self.task_reader.poll(0):
                self.task_reader.recv_bytes()
                count += 1
        return count

    def wait(self, timeout: float) -> list[Any]:
        """Result connections with data, or sentinels of dead workers, within ``timeout``."""
        return mpc.wait(self.results + [p.sentinel for p in self.processes], timeout)

    # -- shutdown ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every worker (politely, then by signal), close pipes, unlink slots."""
        if self.closed:
            return
        self.closed = True
        stop = b"S"
        alive = [p for p in self.processes if p.is_alive()]
        for i in range(len(self.processes)):
            with contextlib.suppress(OSError, ValueError):
                self.task_writer.send_bytes(stop)
            self.send_ctrl(i, stop)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
        for sig_wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, TERM_GRACE_S)):
            alive = [p for p in alive if p.is_alive()]
            if not alive:
                break
            for p in alive:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, sig_wait[0])
            deadline = time.monotonic() + sig_wait[1]
            for p in alive:
                p.join(max(0.0, deadline - time.monotonic()))
        for conn in (*self.ctrl, *self.results, self.task_reader, self.task_writer):
            with contextlib.suppress(OSError):
                conn.close()
        for p in self.processes:
            with contextlib.suppress(ValueError, AttributeError):
                p.close()
        unlink_owned(self.slot_prefix)
