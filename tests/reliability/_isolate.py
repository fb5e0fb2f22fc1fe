"""Run one fault case in its own process, with a hard time limit and faulthandler on.

Two ways, both putting the case in a new session (so that a timeout kills its whole tree):

- :func:`run_case` forks the test process and calls a module-level ``case_*`` function in the
  child. Forking skips the seconds an interpreter needs to import torch (the suite has dozens
  of cases on a 2-core machine) and lets cases take any picklable arguments. The child
  redirects its stdout/stderr to files, arms faulthandler to dump every thread's stack and
  exit shortly before the hard limit, shrinks the engine's intervals (:data:`SHRUNK`), runs
  the case, reports the processes and shared-memory files it still has, and ``os._exit``\\ s.
- :func:`start_interpreter` starts ``python -X faulthandler _isolate.py module:function``
  for the cases where a fresh interpreter matters (interpreter exit, signals to the main
  process, resource limits). Its result comes back on stdout.

The parent fails the test if the case ran past its limit, raised, left processes or left
shared-memory files named after its pid.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import importlib
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHM_DIR = "/dev/shm"
SHM_PREFIX = "stoker-"
RESULT_TAG = "CASE-RESULT "
# Default hard limit of one case (seconds); the child dumps its stacks this much earlier.
DEFAULT_LIMIT_S = 60.0
DUMP_MARGIN_S = 3.0
# How long the child waits for its own workers to be gone after the case returned.
SETTLE_S = 5.0
# How often the parent checks whether a forked case has ended.
REAP_POLL_S = 0.01
# (module, attribute, value): the engine's intervals, shrunk so that a fault case takes a
# second, not a minute. They are read at call time, and forked workers inherit them.
SHRUNK: tuple[tuple[str, str, float], ...] = (
    ("stoker.loader._iterator", "WAIT_SLICE_S", 0.05),
    ("stoker.workers._loop", "PARENT_POLL_S", 0.05),
    ("stoker.workers._process", "STOP_GRACE_S", 0.5),
    ("stoker.workers._process", "TERM_GRACE_S", 0.3),
)


def shrink_intervals() -> None:
    """Apply :data:`SHRUNK` in this process."""
    for module, name, value in SHRUNK:
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            raise AttributeError(f"{module}.{name} is gone: update SHRUNK in {__file__}")
        setattr(mod, name, value)


def shm_entries(prefix: str = SHM_PREFIX, directory: str = SHM_DIR) -> set[str]:
    """Names in ``directory`` that start with ``prefix``, and ``name/file`` for each file in
    such an entry that is a directory (a pool's private directory)."""
    try:
        names = {n for n in os.listdir(directory) if n.startswith(prefix)}
    except FileNotFoundError:
        return set()
    for name in list(names):
        with contextlib.suppress(OSError):
            names.update(f"{name}/{f}" for f in os.listdir(os.path.join(directory, name)))
    return names


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: list[int], within_s: float) -> tuple[list[int], float]:
    """Wait up to ``within_s`` for ``pids`` to end: (still alive, seconds waited)."""
    t0 = time.monotonic()
    while True:
        left = alive(pids)
        waited = time.monotonic() - t0
        if not left or waited > within_s:
            return left, waited
        time.sleep(0.005)


def kill_all(pids: list[int]) -> None:
    """SIGKILL whatever of ``pids`` still runs (so a failing test leaks nothing)."""
    for pid in alive(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def own_leftovers() -> dict[str, Any]:
    """After a case: this process's remaining children and shared-memory files."""
    import psutil

    me = psutil.Process()
    deadline = time.monotonic() + SETTLE_S
    while True:
        gc.collect()
        kids = [p.pid for p in me.children(recursive=True)]
        if not kids or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return {
        "_leftover_children": kids,
        "_leftover_shm": sorted(shm_entries(f"{SHM_PREFIX}{os.getpid()}-")),
    }


@dataclass
class CaseRun:
    """What a case returned and how its process ended."""

    result: dict[str, Any]
    returncode: int
    pid: int
    stdout: str
    stderr: str
    seconds: float


def _fail(message: str) -> None:
    import pytest

    pytest.fail(message, pytrace=False)


def assert_clean(run: CaseRun) -> None:
    """Fail if the case left processes or shared-memory files behind."""
    leftovers = run.result.get("_leftover_children", [])
    kill_all(leftovers)
    stale = shm_entries(f"{SHM_PREFIX}{run.pid}-")
    assert not leftovers, f"the case still had child processes {leftovers} when it ended"
    assert not run.result.get("_leftover_shm"), (
        f"the case left shared-memory files: {run.result['_leftover_shm']}"
    )
    assert not stale, f"shared-memory files of the ended case remain: {sorted(stale)}"


# -- forked cases ----------------------------------------------------------------------------


def _in_child(
    func: Callable[..., dict[str, Any]],
    kwargs: dict[str, Any],
    limit_s: float,
    out_path: str,
    err_path: str,
    result_path: str,
) -> None:
    code = 1
    try:
        os.setsid()
        for fd, path in ((1, out_path), (2, err_path)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        faulthandler.enable(file=sys.stderr, all_threads=True)
        faulthandler.dump_traceback_later(
            max(1.0, limit_s - DUMP_MARGIN_S), exit=True, file=sys.stderr
        )
        shrink_intervals()
        try:
            result: Any = {"value": func(**kwargs)}
            code = 0
        except BaseException:
            result = {"error": traceback.format_exc()}
        result.update(own_leftovers())
        with open(result_path, "wb") as f:
            pickle.dump(result, f)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def run_case(
    func: Callable[..., dict[str, Any]],
    *,
    limit_s: float = DEFAULT_LIMIT_S,
    check_clean: bool = True,
    **kwargs: Any,
) -> CaseRun:
    """Run ``func(**kwargs)`` in a forked child with a hard limit (see the module docstring).

    Args:
        func: a module-level ``case_*`` function returning a picklable dict.
        limit_s: hard limit; past it the child's session is killed and the test fails.
        check_clean: fail unless the child left no processes and no shared-memory files.
        **kwargs: the case's keyword arguments.

    Returns:
        The case's returned dict (``result``), exit code, pid, stdout, stderr and duration.
    """
    with tempfile.TemporaryDirectory(prefix="stoker-reliability-") as tmp:
        out_path, err_path, result_path = (os.path.join(tmp, n) for n in ("out", "err", "res"))
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            _in_child(func, kwargs, limit_s, out_path, err_path, result_path)
        status = None
        while time.monotonic() - t0 < limit_s:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(REAP_POLL_S)
        seconds = time.monotonic() - t0
        timed_out = status is None or not done
        if timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        out = Path(out_path).read_text() if os.path.exists(out_path) else ""
        err = Path(err_path).read_text() if os.path.exists(err_path) else ""
        raw = Path(result_path).read_bytes() if os.path.exists(result_path) else None
    name = getattr(func, "__name__", repr(func))
    if timed_out:
        _fail(f"{name} ran past its hard limit of {limit_s} s; its stderr:\n{err[-8000:]}")
    returncode = os.waitstatus_to_exitcode(status) if status is not None else -9
    if raw is None:
        _fail(f"{name} ended with code {returncode} and no result; stderr:\n{err[-8000:]}")
    result = pickle.loads(raw)
    if "error" in result:
        kill_all(result.get("_leftover_children", []))
        _fail(f"{name} raised:\n{result['error']}\nits stderr:\n{err[-4000:]}")
    value = dict(result["value"])
    value["_leftover_children"] = result["_leftover_children"]
    value["_leftover_shm"] = result["_leftover_shm"]
    run = CaseRun(value, returncode, pid, out, err, seconds)
    if check_clean:
        assert_clean(run)
    return run


# -- fresh interpreters ----------------------------------------------------------------------


def start_interpreter(target: str, **kwargs: Any) -> subprocess.Popen[str]:
    """Start ``target`` (``"module:function"``) in a fresh interpreter, in its own session.

    The case's keyword arguments travel as JSON; it prints what it likes on stdout (the
    test reads it line by line) and its result as the last line, tagged :data:`RESULT_TAG`.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1] / "src")])}
    cmd = [sys.executable, "-X", "faulthandler", str(HERE / "_isolate.py"), target]
    return subprocess.Popen(
        [*cmd, json.dumps(kwargs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def read_line(proc: subprocess.Popen[str], tag: str, limit_s: float) -> str:
    """The first stdout line of ``proc`` that starts with ``tag`` (without it).

    Fails the test (after killing the session) if none comes within ``limit_s``.
    """
    import select

    assert proc.stdout is not None
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(tag):
            return line[len(tag) :].strip()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    _fail(f"no {tag!r} line within {limit_s} s (exit code {proc.returncode}); stderr:\n{err}")
    raise AssertionError  # unreachable: _fail raises


def finish_interpreter(proc: subprocess.Popen[str], limit_s: float) -> tuple[str, str]:
    """Wait for ``proc`` to exit within ``limit_s`` (else kill its session and fail)."""
    try:
        return proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        _fail(f"the interpreter did not exit within {limit_s} s; stderr:\n{err[-8000:]}")
        raise AssertionError from None  # unreachable


def _interpreter_main(target: str, raw_kwargs: str) -> None:
    faulthandler.enable()
    faulthandler.dump_traceback_later(DEFAULT_LIMIT_S, exit=True)
    shrink_intervals()
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    result = func(**json.loads(raw_kwargs))
    if result is not None:
        result.update(own_leftovers())
        print(RESULT_TAG + json.dumps(result), flush=True)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    _interpreter_main(sys.argv[1], sys.argv[2])
