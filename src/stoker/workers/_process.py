"""Starting, feeding, restarting and stopping worker processes (fork, forkserver, spawn).

Channels::

    main --(shared task queue, whole records)---> any idle worker   map-style batches
    main --(one control pipe per worker)--------> worker i          epochs, iterable tasks, stop
    worker i --(one result pipe per worker)-----> main              data headers, errors
    worker i --(status table row i, shared)-----> main              current task, start time
    worker i --(stack file i, on SIGUSR1)-------> main              Python stacks of a hang

Under fork the dataset, ``collate_fn`` and ``worker_init_fn`` are inherited; under spawn and
forkserver they are serialised once with cloudpickle (lambdas and classes defined in
``__main__`` or a notebook work) and reused for every worker, restarts included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gc
import multiprocessing.connection as mpc
import os
import pickle
import signal
import tempfile
import threading
import time
from typing import Any, Final

from stoker.transport import (
    PoolNamespace,
    create_private_file,
    open_private_file,
)
from stoker.workers._loop import RETIRE, STOP, WorkerSpec, worker_main
from stoker.workers._messages import BatchTask, EpochStart, Reply, from_wire, to_wire
from stoker.workers._queue import TaskQueue
from stoker.workers._spawn import serialise_payload
from stoker.workers._status import StatusTable
from stoker.workers._thread_caps import inspect_pools

__all__ = ["WorkerPool", "describe_exit", "torch_killed_sentence"]

# Seconds a worker gets to exit after being asked, then after SIGTERM, before SIGKILL.
STOP_GRACE_S = 1.0
TERM_GRACE_S = 0.5
# Seconds to wait for a worker to write its stacks after SIGUSR1.
STACK_DUMP_WAIT_S = 0.3
# Most characters of a stack dump read back (a worker with thousands of threads).
STACK_DUMP_MAX_BYTES = 1 << 20
_PROTOCOL = 5
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
        return f"signal {sig.name}" + (f" ({cause})" if cause else "")
    return f"exit code {exitcode}"


def torch_killed_sentence(pid: int | None, exitcode: int | None) -> str | None:
    """torch's sentence for a worker killed by a signal (``DataLoader worker (pid 12) is
    killed by signal: Segmentation fault.``, the signal named as ``strsignal(3)`` does), so
    that logs and handlers matching torch's message keep matching; ``None`` for a worker
    that exited."""
    if exitcode is None or exitcode >= 0:
        return None
    name = signal.strsignal(-exitcode) or f"Unknown signal {-exitcode}"
    return f"DataLoader worker (pid {pid}) is killed by signal: {name}."


def _release(proc: Any) -> None:
    """Close the file descriptors of a worker that has exited and been reaped, but keep its
    handle usable: the user may hold ``iterator._workers[i]`` and call ``join()``,
    ``is_alive()`` or read ``exitcode``, as torch's handles allow (``Process.close()``
    would make them raise ``ValueError: process object is closed``). A reaped process
    answers those from its recorded exit code, without its descriptors. A worker not yet
    reaped keeps them until the handle is collected."""
    if proc is None or proc.exitcode is None:
        return
    with contextlib.suppress(AttributeError, OSError, ValueError):
        proc._popen.close()


def _reply(raw: bytes) -> Reply:
    msg = from_wire(pickle.loads(raw))
    assert not isinstance(msg, (BatchTask, EpochStart))  # workers send only replies
    return msg


def _enlarge(conn: Any) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)


class WorkerPool:
    """A fixed set of worker processes, their channels, and their shared files.

    Args:
        ctx: multiprocessing context (decides the start method).
        specs: one :class:`WorkerSpec` per worker (all with the same ``shm_dir`` and
            ``slot_prefix``); the pool's files go to a private directory it makes in
            ``shm_dir`` (:class:`stoker.transport.PoolNamespace`).
        payload: ``(dataset, collate_fn, worker_init_fn)``.
    """

    def __init__(
        self,
        ctx: Any,
        specs: list[WorkerSpec],
        payload: tuple[Any, ...],
        capacity: int | None = None,
    ) -> None:
        self._ctx = ctx
        self.start_method: str = ctx.get_start_method()
        # Pickled once, before anything is created: an unpicklable part fails here, naming
        # its attribute path, with nothing to clean up.
        self._payload: Any = serialise_payload(payload, self.start_method)
        self.namespace = PoolNamespace.create(specs[0].shm_dir)
        self.shm_dir = self.namespace.path
        # Slots /dev/shm has no room for go to files in a private directory on the temp
        # directory's filesystem (page cache) rather than through the pipe.
        self.spill: PoolNamespace | None = None
        if not specs[0].shm_require:
            with contextlib.suppress(OSError):
                self.spill = PoolNamespace.create(tempfile.gettempdir())
        self.spill_dir = self.spill.path if self.spill is not None else None
        self.specs = [
            dataclasses.replace(spec, shm_dir=self.shm_dir, spill_dir=self.spill_dir)
            for spec in specs
        ]
        self.prefix = specs[0].slot_prefix
        base = os.path.join(self.shm_dir, self.prefix)
        try:
            reader, writer = ctx.Pipe(duplex=False)
            _enlarge(writer)
            self.queue = TaskQueue(reader, writer, base + "task-")
            self.capacity = max(len(specs), capacity or 0)
            self.status = StatusTable.create(base + "status", self.capacity)
        except BaseException:
            self.namespace.close()
            if self.spill is not None:
                self.spill.close()
            raise
        self.retired: set[int] = set()
        if self.start_method == "fork":  # done once here, not in every forked worker
            inspect_pools()  # (see workers._thread_caps)
        # Workers started from the main thread may die with the process (PR_SET_PDEATHSIG);
        # from another thread they must not, since that fires when the *thread* exits.
        self._pdeathsig = threading.current_thread() is threading.main_thread()
        self.processes: list[Any] = [None] * len(specs)
        self.ctrl: list[Any] = [None] * len(specs)
        self.results: list[Any] = [None] * len(specs)
        self.closed = False
        try:
            for spec in specs:
                self._start(spec.worker_id)
        except BaseException:
            self.shutdown()
            raise

    def stack_path(self, worker_id: int) -> str:
        return os.path.join(self.shm_dir, f"{self.prefix}stack-{worker_id}")

    def _new_stack_file(self, worker_id: int) -> None:
        """Create worker ``worker_id``'s (empty) stack file; the worker opens it to append."""
        path = self.stack_path(worker_id)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a restarted worker's predecessor's
        os.close(create_private_file(path, os.O_WRONLY))

    def _start(self, worker_id: int) -> None:
        spec = self.specs[worker_id]
        if spec.pdeathsig != self._pdeathsig:
            spec = self.specs[worker_id] = type(spec)(
                **{**spec.__dict__, "pdeathsig": self._pdeathsig}
            )
        ctrl_r, ctrl_w = self._ctx.Pipe(duplex=False)
        res_r, res_w = self._ctx.Pipe(duplex=False)
        _enlarge(ctrl_w)
        _enlarge(res_w)
        self.status.reset(worker_id)
        self._new_stack_file(worker_id)
        proc = self._ctx.Process(
            target=worker_main,
            args=(
                spec,
                self._payload,
                self.queue,
                self.status,
                ctrl_r,
                res_w,
                self.stack_path(worker_id),
            ),
            name=f"stoker-worker-{worker_id}",
            daemon=True,
        )
        # Objects in the permanent generation are never touched by the collector, so a forked
        # worker does not copy the pages that hold them. A user who froze objects already
        # manages the permanent generation: theirs is left exactly as it is.
        frozen = self.start_method == "fork" and gc.get_freeze_count() == 0
        if frozen:
            gc.freeze()
        try:
            proc.start()
        finally:
            if frozen:
                gc.unfreeze()
            ctrl_r.close()
            res_w.close()
        self.processes[worker_id] = proc
        self.ctrl[worker_id] = ctrl_w
        self.results[worker_id] = res_r

    def restart(self, worker_id: int) -> None:
        """Replace a dead worker by a new process with the same id and spec."""
        old = self.processes[worker_id]
        with contextlib.suppress(Exception):
            old.join(0)
        _release(old)
        for conn in (self.ctrl[worker_id], self.results[worker_id]):
            with contextlib.suppress(OSError):
                conn.close()
        self._start(worker_id)

    def room(self) -> int:
        """Workers :meth:`add` can start now (retiring workers hold their ids until they exit)."""
        exited = sum(1 for i in self.retired if self.processes[i].exitcode is not None)
        return exited + self.capacity - len(self.specs)

    def add(self) -> int:
        """Start one more worker (``num_workers="auto"``); returns its id."""
        reusable = [i for i in sorted(self.retired) if self.processes[i].exitcode is not None]
        if reusable:
            worker_id = reusable[0]
            self.retired.discard(worker_id)
            _release(self.processes[worker_id])
        else:
            worker_id = len(self.specs)
            if worker_id >= self.capacity:
                raise RuntimeError(f"the pool holds at most {self.capacity} workers")
            self.specs.append(
                type(self.specs[0])(**{**self.specs[0].__dict__, "worker_id": worker_id})
            )
            self.processes.append(None)
            self.ctrl.append(None)
            self.results.append(None)
        for conn in (self.ctrl[worker_id], self.results[worker_id]):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self._start(worker_id)
        return worker_id

    def retire(self, count: int = 1) -> None:
        """Ask the ``count`` workers that come free first to exit (each answers ``R``).

        The requests go ahead of the queued tasks: behind them, retiring workers would first
        load every batch already queued (on an oversubscribed pool, seconds of work).
        """
        queued = self.queue.drain()
        for raw in [RETIRE] * count + queued:
            self.queue.put(raw)

    def retired_worker(self, worker_id: int) -> None:
        """Record that ``worker_id`` left on request (its exit is not a death)."""
        self.retired.add(worker_id)

    @property
    def active(self) -> list[int]:
        return [i for i in range(len(self.processes)) if i not in self.retired]

    # -- traffic -------------------------------------------------------------------------

    kind: Final = "process"

    def put_task(self, msg: BatchTask) -> None:
        """Queue a batch task for whichever worker is idle first."""
        self.queue.put(pickle.dumps(to_wire(msg), protocol=_PROTOCOL))

    def send_ctrl(self, worker_id: int, msg: BatchTask | EpochStart | bytes) -> None:
        """Send a message to one worker (epoch starts, iterable-dataset tasks, stop)."""
        data = msg if isinstance(msg, bytes) else pickle.dumps(to_wire(msg), protocol=_PROTOCOL)
        with contextlib.suppress(OSError, ValueError):
            self.ctrl[worker_id].send_bytes(data)

    def drain_tasks(self) -> list[BatchTask]:
        """Take back the tasks no worker has taken yet."""
        tasks = [
            from_wire(pickle.loads(raw)) for raw in self.queue.drain() if raw not in (STOP, RETIRE)
        ]
        return [task for task in tasks if isinstance(task, BatchTask)]

    def receive(self, timeout: float) -> list[Reply]:
        """Worker messages that arrive within ``timeout`` (empty if none, or a worker died)."""
        live = [i for i in range(len(self.processes)) if i not in self.retired]
        conns = [self.results[i] for i in live]
        ready = mpc.wait(conns + [self.processes[i].sentinel for i in live], timeout)
        msgs: list[Reply] = []
        for conn in ready:
            if conn in self.results:
                with contextlib.suppress(EOFError, OSError):
                    msgs.append(_reply(conn.recv_bytes()))  # type: ignore[union-attr]
        return msgs

    def dead(self) -> list[tuple[int, int | None, int | None, list[Reply]]]:
        """Workers that exited: ``(worker id, pid, exit code, messages sent before dying)``."""
        out = []
        for i, proc in enumerate(self.processes):
            if i in self.retired or proc.exitcode is None:
                continue
            left: list[Reply] = []
            conn = self.results[i]
            with contextlib.suppress(EOFError, OSError):
                while conn.poll():
                    left.append(_reply(conn.recv_bytes()))
            out.append((i, proc.pid, proc.exitcode, left))
        return out

    def dump_stack(self, worker_id: int) -> str:
        """The Python stacks of a (hung) worker's threads, via faulthandler; "" if none."""
        proc = self.processes[worker_id]
        path = self.stack_path(worker_id)
        try:
            before = os.path.getsize(path)
            os.kill(proc.pid, signal.SIGUSR1)
        except OSError:
            return ""
        deadline = time.monotonic() + STACK_DUMP_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.02)
            with contextlib.suppress(OSError):
                if os.path.getsize(path) > before:
                    time.sleep(0.02)  # let it finish writing
                    break
        try:
            with os.fdopen(open_private_file(path), errors="replace") as f:
                f.seek(before)
                return f.read(STACK_DUMP_MAX_BYTES)
        except OSError:
            return ""

    # -- shutdown ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every worker (politely, then by signal), close channels, unlink files."""
        if self.closed:
            return
        self.closed = True
        procs = [p for p in self.processes if p is not None]
        alive = [p for p in procs if p.is_alive()]
        # Batches in flight are not wanted: workers give them up at their next sample instead
        # of finishing them first, so shutting down does not wait for whole batches.
        with contextlib.suppress(OSError, ValueError):
            self.status.give_up_all()
        for i in range(len(self.processes)):
            with contextlib.suppress(OSError, ValueError):
                self.queue.put(STOP)
            if self.ctrl[i] is not None:
                self.send_ctrl(i, STOP)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, TERM_GRACE_S)):
            alive = [p for p in alive if p.is_alive()]
            if not alive:
                break
            for p in alive:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, sig)
            deadline = time.monotonic() + grace
            for p in alive:
                p.join(max(0.0, deadline - time.monotonic()))
        for conn in (*self.ctrl, *self.results, self.queue.reader, self.queue.writer):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        for p in procs:
            _release(p)
        self.namespace.close()
        if self.spill is not None:
            self.spill.close()


def worker_pid(proc: Any) -> int | None:
    """A worker process's pid; None for a thread or a closed process handle."""
    try:
        return int(proc.pid)
    except (ValueError, AttributeError, TypeError):
        return None
