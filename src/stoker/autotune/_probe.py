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

import gc
import os
import pickle
import select
import signal
import time
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
    "choose_backend",
    "choose_backend_isolated",
]

# Seconds the probe may spend, in all (the serial pass gets a third, the threads the rest).
PROBE_BUDGET_S = 0.6


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
            in it and ``detail["copies"]`` to whether forked workers would copy the
            dataset, once measured.
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
    serial = serial_pass(dataset, collate_fn, size, n, suspect, budget_s / 3, early)
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
) -> tuple[str, str]:
    """:func:`choose_backend` in a forked child, so the probe's reads leave no trace here.

    A dataset that opens files lazily would otherwise open them in this process, and forked
    workers would inherit the handles (unsafe for h5py, LMDB, sockets).
    """
    if iterable or not hasattr(os, "fork"):
        return choose_backend(
            dataset, collate_fn, batch_size, iterable, allow_inline=allow_inline, detail=detail
        )
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(r)
        _probe_in_child(w, dataset, collate_fn, batch_size, allow_inline)
    os.close(w)
    answer = _read_answer(r, pid)
    if answer is None:
        return "process", f"the backend probe gave no answer within {PROBE_DEADLINE_S:.0f} s"
    try:
        backend, why, *found = pickle.loads(answer)
    except Exception:
        return "process", "backend probe failed; using processes"
    if detail is not None and found and isinstance(found[0], dict):
        detail.update(found[0])
    return str(backend), str(why)


def _probe_in_child(
    w: int, dataset: Any, collate_fn: Any, batch_size: int, allow_inline: bool
) -> None:  # pragma: no cover - runs in the forked child
    """Probe, write the pickled answer to ``w`` and exit (never returns)."""
    code = 0
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
        )
        os.write(w, pickle.dumps((*result, probed)))
    except BaseException as exc:
        try:
            os.write(w, pickle.dumps(("process", f"probe failed: {exc!r:.200}")))
        except BaseException:
            code = 1
    finally:
        os._exit(code)


def _read_answer(r: int, pid: int) -> bytes | None:
    """The probing child's answer from ``r``; None when it gave none by the deadline (it is
    killed then). Reaps the child and closes ``r``."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + PROBE_DEADLINE_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                return None
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return b"".join(chunks) or None
