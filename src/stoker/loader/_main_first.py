"""The epoch's first batch loaded in the main process, checked for what it left open there
(``num_workers="auto"``).

torch's ``num_workers=0`` has its first batch once the batch is loaded; a loader with workers
forks first, and a fork and a child's start alone take longer than a cheap batch's whole
loading (2-core VM, medians of 5 fresh interpreters: tiny 44 ms against 4, large 120 against
28; jpeg 332 against 229 and heavytail 408 against 391 with the first batch loaded by a forked
child beside the backend probe, :mod:`stoker.loader._head`). ``num_workers="auto"`` may load
in the main process anyway (the probe chooses it for cheap batches), so here the iterator's
first ``next()`` loads the batch its workers would load first (the same indices, seed and
collation, the caller's random state saved and restored, as :mod:`stoker.loader._inline` does)
right there, before anything is forked. Where its first sample shows the batch taking
:data:`~stoker.loader._head_parts.HEAD_SPLIT_MIN_S` or more, left the global random generators
as seeded and left nothing open, the rest loads in parts side by side, one per usable core, in
helpers forked then (:func:`~stoker.loader._head_parts.load_in_parts`, as the head start's
child does): io's first batch came 0.65x as late as torch ``num_workers=0``'s (114.6 against
177.6 ms, benchmarks/first_batch.py, medians of 7).

What made loading in the main process unsafe before workers is what the loading leaves open
there: an h5py file or an LMDB environment opened on first use would be inherited by every
forked worker, which neither allows. So the batch is loaded on a shallow copy of the dataset,
and of the datasets it holds (a ``Subset`` from ``random_split`` around yours): what
``__getitem__`` opens onto ``self`` lands on a copy and closes with it. Then the
descriptors and Python threads of this process are compared before and after: where the
loading left none behind, forking is what it was before the batch; where it left some (a
handle kept in an object the copy shares with the dataset, or in a module's cache) that are
still open at the second ``next()``, and workers fork, the loader keeps loading in the main
process for good, with a warning that names them and the fix. A descriptor or thread that
another thread of the program opens while the batch loads, and keeps past that second look,
is counted too (the warning says so): the cost of a false alarm is loading in the main
process, never a shared handle.

The backend probe (:mod:`stoker.autotune._probe`) forks at the second ``next()``, once the
loading was found to leave nothing open, and its answer decides there: workers from the second
batch (as after a head start), or the main process (the epoch goes on with the iterator of
:mod:`stoker.loader._inline`, which adopts it). Forked beside the batch instead (once it had
taken 50 ms, at a moment it held nothing open), the probe took a core from it: jpeg's first
batch 341 ms against 223 without (medians of 5; its 20th batch came 0.11 s sooner). Where
the batch has a sample that fails or raises, a worker (or the main process, where it stays)
loads it again: its error keeps its type and traceback, a failure is recorded once. Not tried
with a ``timeout`` (the main process cannot give up on a sample), a ``worker_init_fn``
(workers run it before loading), a resumed epoch, an iterable dataset, a datapipe, or where
``/proc/self/fd`` cannot be read or there is no ``fork``; nor with ``num_workers=N``, which
asks for workers whatever the loading leaves open (a head start loads the first batch there).
"""

from __future__ import annotations

import copy
import gc
import os
import threading
import time
from typing import Any

import torch.utils.data as tud

from stoker.loader._head_parts import (
    HEAD_SPLIT_MIN_S,
    Helpers,
    load_in_parts,
    part_count,
    rng_fingerprint,
)
from stoker.sampling._seeding import CallerRandomState, seed_all
from stoker.workers._fetch import BatchFetcher

__all__ = ["DATASET_DEPTH", "MainFirst", "copy_datasets", "open_files"]

_FD_DIR = "/proc/self/fd"
# Levels of datasets held by datasets (a Subset of a ConcatDataset of yours: 2) copied for the
# first batch; deeper ones are shared with the original.
DATASET_DEPTH = 4


def open_files() -> dict[int, tuple[int, int]] | None:
    """This process's open descriptors, each with the (device, inode) it refers to; None
    where :data:`_FD_DIR` cannot be read."""
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return None
    found: dict[int, tuple[int, int]] = {}
    for name in names:
        try:
            fd = int(name)
            st = os.fstat(fd)
        except (ValueError, OSError):  # (the listing's own descriptor, closed by now)
            continue
        found[fd] = (st.st_dev, st.st_ino)
    return found


def copy_datasets(dataset: Any, depth: int = DATASET_DEPTH) -> Any:
    """A shallow copy of ``dataset``, with the datasets it holds (an attribute, or a list or
    tuple of them: ``Subset.dataset``, ``ConcatDataset.datasets``) copied in turn, ``depth``
    levels down: what the innermost opens on itself lands on its copy."""
    dup = copy.copy(dataset)
    state = getattr(dup, "__dict__", None)
    if depth <= 0 or not isinstance(state, dict):
        return dup
    for name, value in list(state.items()):
        if isinstance(value, tud.Dataset):
            state[name] = copy_datasets(value, depth - 1)
        elif (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, tud.Dataset) for v in value)
        ):
            state[name] = type(value)(copy_datasets(v, depth - 1) for v in value)
    return dup


class _Snapshot:
    """What this process holds open at one moment: descriptors and Python threads (the
    thread objects themselves: an exited thread's ident may be reused)."""

    def __init__(self) -> None:
        self.files = open_files() or {}
        self.threads = set(threading.enumerate())

    def left_open(self) -> str:
        """What is open now that was not then, described ("" for nothing)."""
        return ", ".join(self.opened())

    def opened(self) -> list[str]:
        """Each descriptor and thread open now that was not then, described."""
        now = open_files()
        if now is None:  # (no descriptor left to list them with, say)
            return [f"descriptors that {_FD_DIR} could not list"]
        found = []
        for fd, ident in sorted(now.items()):
            if self.files.get(fd) != ident:
                try:
                    target = os.readlink(f"{_FD_DIR}/{fd}")
                except OSError:
                    target = "?"
                found.append(f"descriptor {fd} ({target})")
        found.extend(f"thread {t.name!r}" for t in threading.enumerate() if t not in self.threads)
        return found


class MainFirst:
    """The iterator's first batch, loaded in the main process (see the module docstring).

    Made by the loader at ``iter()``; the iterator calls :meth:`load` at its first ``next()``,
    and reads :attr:`left` at the next, where it forks the backend probe (none left) or keeps
    loading in the main process (some).
    """

    def __init__(self) -> None:
        self._before: _Snapshot | None = None
        self._left: list[str] = []  # what loading the batch left open here
        self.parts = 1  # parts the batch was loaded in side by side
        self._helpers: Helpers | None = None

    @property
    def left(self) -> str:
        """What loading the batch left open here, described ("" for nothing)."""
        return ", ".join(self._left)

    @staticmethod
    def eligible(loader: Any) -> bool:
        """Whether ``loader``'s next first batch may be loaded in the main process."""
        return (
            bool(getattr(loader, "_auto_workers", False))
            and hasattr(os, "fork")
            and not loader.timeout
            and loader.worker_init_fn is None
            and getattr(loader, "_resume_state", None) is None
            and not isinstance(loader.dataset, (tud.IterableDataset, tud.MapDataPipe))
            and open_files() is not None
        )

    def load(self, loader: Any, index: Any, seed: int, auto_collation: bool) -> Any:
        """The batch at ``index``, seeded with ``seed``, loaded here; None where a worker must
        load it (a sample failed or raised, or the dataset cannot be copied). Sets
        :attr:`left` whatever the outcome."""
        before = self._before = _Snapshot()
        batch = None
        try:
            dataset = copy_datasets(loader.dataset)
        except Exception:  # (a dataset whose __getattr__ recurses in copy, say)
            dataset = None
        if dataset is not None:
            batch = self._fetch(loader, dataset, index, seed, auto_collation, before)
            del dataset
        self._left = before.opened()
        if self._left:  # (a handle on the copy that a reference cycle keeps)
            gc.collect()
            self._left = before.opened()
        return batch

    def still_left(self) -> str:
        """What the loading left open that is open still (a second look, at the next
        ``next()``: a file another thread of the program had open a moment is gone by then);
        "" for nothing."""
        if not self._left or self._before is None:
            return self.left
        gc.collect()
        return ", ".join(part for part in self._before.opened() if part in self._left)

    def close(self) -> None:
        """Reap the helpers that loaded parts of the batch (their exit waited for their
        memory's teardown: left out of the first batch's time)."""
        helpers, self._helpers = self._helpers, None
        if helpers is not None:
            helpers.close()

    def _fetch(
        self,
        loader: Any,
        dataset: Any,
        index: Any,
        seed: int,
        auto_collation: bool,
        before: _Snapshot,
    ) -> Any:
        fetcher = BatchFetcher(
            dataset,
            iterable=False,
            auto_collation=auto_collation,
            collate_fn=loader.collate_fn,
            drop_last=loader.drop_last,
            on_error=loader.failure_policy.on_error,
        )
        parts = fetcher.one_by_one and isinstance(index, list) and len(index) > 1
        caller = CallerRandomState()
        saved = caller.save()
        try:
            seed_all(seed)
            if parts:
                return fetcher.collate_fn(self._in_parts(dataset, index, seed, before))
            batch, failures = fetcher.fetch(index, seed)
        except Exception:  # a worker loads it again, and raises what it raises
            return None
        finally:
            caller.restore(saved)
            if self._helpers is not None:
                self._helpers.stop()  # (their sockets closed before the check: not left open)
        return None if failures else batch

    def _in_parts(self, dataset: Any, index: list[Any], seed: int, before: _Snapshot) -> list[Any]:
        """``[dataset[i] for i in index]``, the rest in parts side by side after the first
        sample where it shows the batch slow, left the random generators as seeded and left
        nothing open (helpers forked then share nothing the loading opened). Called right
        after seeding with ``seed``."""
        t0 = time.perf_counter()
        first = dataset[index[0]]
        rest = index[1:]
        # (a cheap batch pays for nothing more: tiny's first batch read 4.0-4.8 ms, against
        # 3.2-3.5, with the generators' digest taken before its first sample)
        slow = (time.perf_counter() - t0) * len(index) >= HEAD_SPLIT_MIN_S
        count = part_count(len(index)) if slow else 1
        if count > 1 and not before.left_open() and _as_seeded(seed):
            samples, self.parts, self._helpers = load_in_parts(dataset, rest, count)
            return [first, *samples]
        return [first, *(dataset[i] for i in rest)]


def _as_seeded(seed: int) -> bool:
    """Whether the global random generators stand as ``seed_all(seed)`` left them."""
    now = rng_fingerprint()
    caller = CallerRandomState()
    saved = caller.save()
    try:
        seed_all(seed)
        return rng_fingerprint() == now
    finally:
        caller.restore(saved)
