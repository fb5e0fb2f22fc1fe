"""``backend="auto"``: a short measurement that picks inline, thread or process loading.

It runs in a forked child (a copy of the process, as a worker would be) and loads samples one
at a time, timing wall and CPU time of each and collating them into batches, and measures how
many private bytes reading them copied (copy-on-read of Python objects); then, where samples
wait or the dataset would be copied (elsewhere the answer is processes whatever threads do), it
loads as many other samples with two threads at once, and where a few slow samples wait for
much of the time, enough threads at once to see whether their work runs in parallel. The rules
that turn these measurements into a backend are in :mod:`stoker.autotune._backend_rule`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import select
import signal
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from stoker._introspect.platform import usable_cores
from stoker.autotune._backend_rule import (
    COW_BYTES_PER_SAMPLE,
    INLINE_BATCH_S,
    TAIL_WINDOW_S,
    ProbeFacts,
    decide_backend,
    early_samples,
    settled,
    tail_threads,
    wants_speedup,
)
from stoker.autotune._probe_passes import (
    PROBE_DEADLINE_S,
    busy_threads,
    holds_python_objects,
    serial_pass,
    thread_speedup,
)

__all__ = [
    "COW_BYTES_PER_SAMPLE",
    "INLINE_BATCH_S",
    "PROBE_BUDGET_S",
    "PROBE_NICE_AFTER_MARK",
    "ProbeChild",
    "choose_backend",
    "choose_backend_isolated",
]

# Seconds the probe may spend, in all (the serial pass gets a third, the threads the rest).
PROBE_BUDGET_S = 0.6
# What the probing child writes before its answer when batches are slow (see on_slow_batch).
SLOW_MARK = b"S"
# Added to the probing child's nice value once it has written SLOW_MARK.
PROBE_NICE_AFTER_MARK = 19


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
    on_warm: Callable[[float], None] | None = None,
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
            in it and ``detail["copies"]`` to whether forked workers would copy the
            dataset, once measured.
        on_warm: called with the seconds a batch takes as soon as the serial pass's warm-up
            shows it, more than once (see :func:`~stoker.autotune._probe_passes.serial_pass`).
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
    early = (early_samples(size), settled)
    # Copying is measured only where the dataset holds something to copy: each reading of
    # the process's memory map costs tens of milliseconds, more than cheap samples' pass.
    suspect = forked and holds_python_objects(dataset)
    serial = serial_pass(dataset, collate_fn, size, n, suspect, budget_s / 3, early, on_warm)
    copies = suspect and serial.copied >= COW_BYTES_PER_SAMPLE
    facts = ProbeFacts(
        waiting=serial.waiting,
        waiting_all=serial.waiting_all,
        batch_s=serial.batch_s,
        copied=serial.copied,
        copies=copies,
        allow_inline=allow_inline,
    )
    if detail is not None:
        detail.update(
            wait_share=facts.waiting_all,
            batch_s=facts.batch_s,
            copies=copies,
        )
    next_index = serial.next_index
    # The rounds would take the rest of the budget, hundreds of milliseconds before the first
    # worker starts: only where their answer matters.
    if wants_speedup(facts.waiting, copies):
        speedup, next_index = thread_speedup(
            dataset, n, serial.walls, next_index, serial.started, budget_s
        )
        facts = replace(facts, speedup=speedup)
    count = tail_threads(facts)
    if count:
        cores = busy_threads(dataset, n, next_index, count, TAIL_WINDOW_S, join=not forked)
        facts = replace(facts, tail_threads=count, tail_cores=cores)
    choice = decide_backend(facts)
    if detail is not None and choice.waits:
        detail["waits"] = True
    return choice.backend, choice.why


def choose_backend_isolated(
    dataset: Any,
    collate_fn: Any,
    batch_size: int,
    iterable: bool,
    *,
    allow_inline: bool = True,
    detail: dict[str, Any] | None = None,
    on_slow_batch: tuple[float, Callable[[], None]] | None = None,
) -> tuple[str, str]:
    """:func:`choose_backend` in a forked child, so the probe's reads leave no trace here.

    A dataset that opens files lazily would otherwise open them in this process, and forked
    workers would inherit the handles (unsafe for h5py, LMDB, sockets).

    ``on_slow_batch``: ``(seconds, call)``: ``call()`` runs here, once, while the child still
    probes, as soon as its warm-up shows a batch taking at least ``seconds``.
    """
    if iterable or not hasattr(os, "fork"):
        return choose_backend(
            dataset, collate_fn, batch_size, iterable, allow_inline=allow_inline, detail=detail
        )
    slow_s = on_slow_batch[0] if on_slow_batch is not None else None
    probe = ProbeChild.start(dataset, collate_fn, batch_size, allow_inline, slow_s)
    if on_slow_batch is not None and probe.wait_slow():
        on_slow_batch[1]()
    return probe.answer(detail)


class ProbeChild:
    """:func:`choose_backend` running in a forked child, waited on in two steps: whether its
    warm-up found batches slow (:meth:`wait_slow`), then its answer (:meth:`answer`), which
    the loader may take much later (see :mod:`stoker.loader._head`)."""

    def __init__(self, pid: int, r: int) -> None:
        self.pid = pid
        self._r = r
        self._chunks: list[bytes] = []
        self._deadline = time.monotonic() + PROBE_DEADLINE_S
        self._ended = False  # the answer is read (or the child was stopped)
        self._marked = False  # the child said batches are slow
        self._reap = weakref.finalize(self, _stop_child, pid, r)

    @classmethod
    def start(
        cls,
        dataset: Any,
        collate_fn: Any,
        batch_size: int,
        allow_inline: bool,
        slow_s: float | None = None,
    ) -> ProbeChild:
        """Fork the child; it writes :data:`SLOW_MARK` first when a batch takes ``slow_s`` or
        more (None: never), then its answer."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            os.close(r)
            _probe_in_child(w, dataset, collate_fn, batch_size, allow_inline, slow_s)
        os.close(w)
        return cls(pid, r)

    def fileno(self) -> int:
        """The pipe's descriptor (readable when the child wrote or is gone)."""
        return self._r

    def left(self) -> float:
        """Seconds left before the child's deadline."""
        return max(0.0, self._deadline - time.monotonic())

    def wait_slow(self) -> bool:
        """Block until the child says batches are slow (True) or has answered (False)."""
        return self._read(until_mark=True)

    def answer(self, detail: dict[str, Any] | None = None) -> tuple[str, str]:
        """``(backend, why)`` as :func:`choose_backend` returns them, ``detail`` filled in;
        processes when the child gave no answer within :data:`PROBE_DEADLINE_S` of its start
        (it is stopped then) or failed."""
        self._read(until_mark=False)
        answer = b"".join(self._chunks)
        if not answer:
            return "process", f"the backend probe gave no answer within {PROBE_DEADLINE_S:.0f} s"
        try:
            # The child is a fork of this process: its answer is this process's own data.
            backend, why, *found = pickle.loads(answer)
        except Exception:
            return "process", "backend probe failed; using processes"
        if detail is not None and found and isinstance(found[0], dict):
            detail.update(found[0])
        return str(backend), str(why)

    def close(self) -> None:
        """Stop the child if it still runs and reap it."""
        self._ended = True
        self._reap()

    def _read(self, until_mark: bool) -> bool:
        r = self._r
        while not self._ended:
            left = max(0.0, self._deadline - time.monotonic())
            # What the child wrote counts even when the deadline passed while nobody read.
            if not select.select([r], [], [], left)[0]:
                self._chunks.clear()
                self.close()
                return False
            chunk = os.read(r, 65536)
            if not chunk:
                self._ended = True
                self._reap()
                return False
            if not self._chunks and not self._marked and chunk.startswith(SLOW_MARK):
                self._marked = True  # (a pickle starts with 0x80)
                chunk = chunk[len(SLOW_MARK) :]
                if chunk:
                    self._chunks.append(chunk)
                if until_mark:
                    return True
                continue
            self._chunks.append(chunk)
        return False


def _stop_child(pid: int, r: int) -> None:
    with contextlib.suppress(OSError):
        os.close(r)
    with contextlib.suppress(OSError):
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _probe_in_child(
    w: int,
    dataset: Any,
    collate_fn: Any,
    batch_size: int,
    allow_inline: bool,
    slow_s: float | None,
) -> None:  # pragma: no cover - runs in the forked child
    """Probe, write the pickled answer to ``w`` and exit (never returns); first
    :data:`SLOW_MARK` when a batch takes ``slow_s`` or more."""
    code = 0

    marked = False

    def on_warm(batch_s: float) -> None:
        nonlocal marked
        if slow_s is not None and batch_s >= slow_s and not marked:
            marked = True
            os.write(w, SLOW_MARK)
            # The head start's child loads the first batch now: the rest of the probe must
            # not take its core (its serial pass discounts the time it waits for one).
            with contextlib.suppress(OSError):
                os.nice(PROBE_NICE_AFTER_MARK)

    try:
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
            False,
            allow_inline=allow_inline,
            forked=True,
            detail=probed,
            on_warm=on_warm,
        )
        os.write(w, pickle.dumps((*result, probed)))
    except BaseException as exc:
        try:
            os.write(w, pickle.dumps(("process", f"probe failed: {exc!r:.200}")))
        except BaseException:
            code = 1
    finally:
        os._exit(code)
