"""Fetching and collating one batch, with the ``on_error`` policy applied.

Shared by worker processes and the inline (``num_workers=0``) iterator. With
``on_error="raise"`` it is torch's own fetcher. Otherwise each sample is loaded on its own;
one that raises is recorded and dropped (``"skip"``) or replaced by another sample drawn from
the batch's seed (``"replace"``); a ``collate_fn`` that raises drops the whole batch.

Workers pass a ``stop`` check, run between the samples of a map-style batch: once it is true
(the loop abandoned the batch's epoch), the batch is given up with :class:`Abandoned` instead
of being finished for nobody while the next epoch's first batches wait for the worker.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from typing import Any

from torch.utils.data._utils import fetch as _fetch

from stoker.faults import MAX_REPLACEMENT_TRIES
from stoker.sampling._seeding import seed_all

__all__ = ["Abandoned", "BatchFetcher", "SkipBatch", "fetch_stream"]

# A map-style batch's samples are loaded in runs between checks that the loop still wants
# it, each run sized from the last one's pace to take about this long (BatchFetcher._load_all).
STOP_CHECK_S = 0.001
# One recorded failure: (index, exception type name, message, replacement index or None).
FailureRecord = tuple[Any, str, str, Any]


class SkipBatch(Exception):
    """Nothing of this batch could be loaded (tolerant policies only)."""

    def __init__(self, failures: list[FailureRecord]) -> None:
        super().__init__(f"{len(failures)} failures")
        self.failures = failures


class Abandoned(Exception):
    """The batch's epoch was abandoned: it was given up between two samples."""


# The replacement a stream's failed item records under "replace": the item after it.
_NEXT_ITEM = "the stream's next item"


def _record(index: Any, exc: BaseException, replacement: Any = None) -> FailureRecord:
    return (index, type(exc).__qualname__, str(exc), replacement)


class BatchFetcher:
    """Loads batches of one dataset for one epoch.

    Args:
        dataset: the dataset.
        iterable: whether it is an ``IterableDataset``.
        auto_collation: whether tasks are lists of indices (``batch_size`` is set).
        collate_fn: the loader's collate function.
        drop_last: drop an incomplete last batch (iterable datasets).
        on_error: ``"raise"``, ``"skip"`` or ``"replace"``.
        reseed: seeds the global generators with a batch's seed again, before its samples
            are loaded one by one after ``__getitems__`` raised. Default :func:`seed_all`.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        iterable: bool,
        auto_collation: bool,
        collate_fn: Any,
        drop_last: bool,
        on_error: str,
        reseed: Callable[[int], None] = seed_all,
    ) -> None:
        self.dataset = dataset
        self._reseed = reseed
        self.iterable = iterable
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.tolerant = on_error != "raise"
        self.replace = on_error == "replace"
        self._drop_last = drop_last
        kind = _fetch._IterableDatasetFetcher if iterable else _fetch._MapDatasetFetcher
        # An iterable dataset's iterator is created here, once per epoch.
        self._torch = kind(dataset, auto_collation, collate_fn, drop_last)

    def fetch(
        self, index: Any, seed: int, stop: Callable[[], bool] | None = None
    ) -> tuple[Any, list[FailureRecord]]:
        """The collated batch for ``index`` and the failures met loading it.

        Args:
            index: the task's indices (or index).
            seed: the batch's seed.
            stop: checked between the samples of a map-style batch: true gives it up.

        Raises:
            StopIteration: an iterable dataset is exhausted.
            SkipBatch: nothing could be loaded (tolerant policies).
            Abandoned: ``stop`` turned true.
            Exception: whatever the dataset raised (``on_error="raise"``).
        """
        if not self.tolerant:
            if stop is None or self.iterable or not self.auto_collation or self._getitems():
                return self._torch.fetch(index), []
            return self.collate_fn(self._load_all(index, stop)), []
        failures: list[FailureRecord] = []
        if self.iterable:
            return self._fetch_stream_tolerant(index)
        samples: list[Any] = []
        if not self.auto_collation:
            self._load_one(index, seed, failures, samples)
            if not samples:
                raise SkipBatch(failures)
            return self.collate_fn(samples[0]), failures
        getitems = self._getitems()
        loaded = False
        if getitems:
            try:
                samples = getitems(index)
                loaded = True
            except Exception:
                self._reseed(seed)  # load one by one, from the same random state
                samples = []
        if not loaded:
            for i in index:
                if stop is not None and stop():
                    raise Abandoned
                self._load_one(i, seed, failures, samples)
        return self._collate_tolerant(samples, failures, index)

    def _fetch_stream_tolerant(self, index: Any) -> tuple[Any, list[FailureRecord]]:
        """torch's iterable fetch, item by item: an item that raises is recorded and dropped
        (under ``"replace"``: replaced by the stream's next item, at most
        :data:`MAX_REPLACEMENT_TRIES` times per item, so a stream that only raises cannot
        spin), instead of losing the whole batch. An iterator object can go on after raising;
        a generator cannot (Python ends it): its stream is then over for the epoch."""
        fetcher = self._torch
        if not isinstance(fetcher, _fetch._IterableDatasetFetcher):
            raise TypeError("a map-style dataset has no stream")
        if fetcher.ended:
            raise StopIteration
        stream = fetcher.dataset_iter
        replaced = _NEXT_ITEM if self.replace else None
        wanted = len(index) if self.auto_collation else 1
        budget = wanted * (1 + MAX_REPLACEMENT_TRIES) if self.replace else wanted
        samples: list[Any] = []
        failures: list[FailureRecord] = []
        attempts = 0
        while len(samples) < wanted and attempts < budget and not fetcher.ended:
            attempts += 1
            try:
                samples.append(next(stream))
            except StopIteration:
                fetcher.ended = True
            except Exception as exc:
                failures.append(_record(None, exc, replaced))
        if replaced is not None and len(samples) < wanted:
            # The stream ended (or the budget ran out) before the last failures were replaced.
            keep = len(failures) - min(len(failures), wanted - len(samples))
            failures = failures[:keep] + [(i, t, m, None) for i, t, m, _ in failures[keep:]]
        if not samples:
            if failures:
                raise SkipBatch(failures)
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(samples[0]), failures
        if fetcher.ended and self._drop_last and len(samples) < wanted:
            if failures:
                raise SkipBatch(failures)
            raise StopIteration  # torch drops the stream's incomplete last batch
        return self._collate_tolerant(samples, failures, index)

    def _collate_tolerant(
        self, samples: list[Any], failures: list[FailureRecord], index: Any
    ) -> tuple[Any, list[FailureRecord]]:
        if not samples:
            raise SkipBatch(failures)
        try:
            return self.collate_fn(samples), failures
        except Exception as exc:
            raise SkipBatch([*failures, _record(list(index), exc)]) from exc

    def shareable(self) -> bool:
        """Whether a batch can be loaded in runs of samples by several threads at once (see
        :mod:`stoker.workers._board`): a map-style dataset's list of indices, loaded sample by
        sample (a ``__getitems__`` loads a batch at once)."""
        return not self.iterable and self.auto_collation and not self._getitems()

    def load_run(self, indices: list[Any], seed: int, seconds: float = math.inf) -> list[Any]:
        """One run of a shared batch: each sample, or under a tolerant policy each position's
        ``(samples, failures)`` (a failed sample is dropped or replaced as :meth:`fetch`
        does). Raises what the dataset raised under ``on_error="raise"``.

        A run that has taken more than ``seconds`` by the end of its 1st, 2nd, 4th, 8th...
        sample ends there, short (its caller gives the rest back to the batch): its length was
        set from the pace of earlier samples, which may have been far quicker (a clock read
        per sample would cost 5% of a microsecond sample)."""
        dataset, tolerant = self.dataset, self.tolerant
        out: list[Any] = []
        rest = iter(indices)
        t0 = time.perf_counter()
        chunk = 1  # samples until the next look at the clock: 1, 1, 2, 4, 8...
        while True:
            if tolerant:
                for i in itertools.islice(rest, chunk):
                    samples: list[Any] = []
                    failures: list[FailureRecord] = []
                    self._load_one(i, seed, failures, samples)
                    out.append((samples, failures))
            else:
                out += [dataset[i] for i in itertools.islice(rest, chunk)]
            if len(out) >= len(indices) or time.perf_counter() - t0 > seconds:
                return out
            chunk = len(out)

    def collate_runs(self, parts: list[Any], index: Any) -> tuple[Any, list[FailureRecord]]:
        """The batch and its failures from every position's :meth:`load_run` result, in the
        batch's order (raises :class:`SkipBatch` as :meth:`fetch` does)."""
        if not self.tolerant:
            return self.collate_fn(parts), []
        samples = [s for loaded, _ in parts for s in loaded]
        failures = [f for _, failed in parts for f in failed]
        return self._collate_tolerant(samples, failures, index)

    @property
    def one_by_one(self) -> bool:
        """Whether a batch is ``collate_fn([dataset[i] for i in index])`` exactly: a map-style
        dataset without ``__getitems__``, batches of indices, the ``"raise"`` policy."""
        return not (self.tolerant or self.iterable or not self.auto_collation or self._getitems())

    def _getitems(self) -> Any:
        return getattr(self.dataset, "__getitems__", None)  # torch's test: set and truthy

    def _load_all(self, index: Any, stop: Callable[[], bool]) -> list[Any]:
        """``[dataset[i] for i in index]`` (torch's fetch), giving up when ``stop()``.

        ``stop`` runs before the first sample, then after runs of samples sized from the
        last run's pace to take about :data:`STOP_CHECK_S`: between every two slow samples,
        once or twice a batch of fast ones (checking between each of 256 one-microsecond
        samples cost 10%).
        """
        dataset, samples, it, run = self.dataset, [], iter(index), 1
        while True:
            if stop():
                raise Abandoned
            t0 = time.perf_counter()
            loaded = [dataset[i] for i in itertools.islice(it, run)]
            samples += loaded
            if len(loaded) < run:
                return samples
            run = max(1, int(run * STOP_CHECK_S / max(time.perf_counter() - t0, 1e-9)))

    def _load_one(self, i: Any, seed: int, failures: list[FailureRecord], out: list[Any]) -> None:
        try:
            out.append(self.dataset[i])
        except Exception as exc:
            replacement = None
            if self.replace:
                sample, replacement = self._replacement(seed, i)
                if replacement is not None:
                    out.append(sample)
            failures.append(_record(i, exc, replacement))

    def _replacement(self, seed: int, failed: Any) -> tuple[Any, Any]:
        rng = random.Random(f"{seed}/{failed!r}")
        n = len(self.dataset)
        for _ in range(MAX_REPLACEMENT_TRIES):
            j = rng.randrange(n)
            try:
                return self.dataset[j], j
            except Exception:
                continue
        return None, None


def fetch_stream(
    fetcher: BatchFetcher | None,
    error: BaseException | None,
    on_error: str,
    index: Any,
    seed: int,
    stop: Callable[[], bool] | None = None,
) -> tuple[Any, list[FailureRecord]]:
    """One batch of a worker's stream for this epoch.

    Args:
        fetcher: the epoch's fetcher (None: the stream is over).
        error: what creating the fetcher raised (an iterable dataset's ``__iter__``), reported
            once by the caller, who then treats the stream as over.
        on_error: the loader's policy.
        index: the task's indices.
        seed: the batch's seed.
        stop: see :meth:`BatchFetcher.fetch`.

    Raises:
        StopIteration: the stream is over.
        SkipBatch: ``error`` under a tolerant policy, or nothing of the batch loaded.
        Abandoned: ``stop`` turned true.
    """
    if error is not None:
        if on_error != "raise":
            raise SkipBatch([_record(None, error)])
        raise error
    if fetcher is None:
        raise StopIteration
    return fetcher.fetch(index, seed, stop)
