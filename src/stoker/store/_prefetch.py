"""Background downloads that run ahead of the reader, in the order it will read.

The reader gives the plan (the shards it will read, in order) and reports each shard it
starts; the prefetcher keeps downloading the next shards into the cache on a few threads of the
reading process, no further ahead than ``ahead_bytes`` past the current shard, so that a
budget smaller than the dataset is not filled with shards read much later. A failed prefetch
is dropped: the reader's own fetch then retries it and raises the error where it is seen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["DEFAULT_AHEAD_BYTES", "DEFAULT_CONCURRENCY", "Prefetcher"]

#: Downloads at a time per reading process.
DEFAULT_CONCURRENCY = 4
#: Bytes of shards fetched ahead of the one being read (and so at most in flight).
DEFAULT_AHEAD_BYTES = 512 * 1024 * 1024


class Prefetcher:
    """Downloads planned shards ahead of the reader.

    Args:
        fetch: downloads shard number ``k`` into the cache (not pinned afterwards).
        sizes: bytes of each shard, by number.
        concurrency: downloads at a time. Default 4.
        ahead_bytes: bytes planned past the current shard. Default 512 MiB (a single shard
            larger than that is still fetched, one at a time).
    """

    def __init__(
        self,
        fetch: Callable[[int], None],
        sizes: Sequence[int],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        ahead_bytes: int = DEFAULT_AHEAD_BYTES,
    ) -> None:
        self._fetch = fetch
        self._sizes = list(sizes)
        self._ahead = ahead_bytes
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="stoker-prefetch")
        self._lock = threading.Lock()
        self._plan: list[int] = []
        self._position = 0
        self._next = 0  # plan index of the next shard to submit
        self._started: dict[int, Future[None]] = {}
        self._first_done = False  # one download alone first: the reader is waiting for it

    def plan(self, shards: Sequence[int]) -> None:
        """Replace the plan with ``shards`` (numbers, in reading order) and start on it."""
        with self._lock:
            self._plan = list(shards)
            self._position = 0
            self._next = 0
            self._started = {k: f for k, f in self._started.items() if not f.done()}
        self._submit()

    def reading(self, shard: int) -> None:
        """The reader has moved to ``shard``; fetch further ahead."""
        with self._lock:
            try:
                at = self._plan.index(shard, self._position)
            except ValueError:
                return
            self._position = at
            self._next = max(self._next, at + 1)
        self._submit()

    def _submit(self) -> None:
        with self._lock:
            budget = self._ahead
            for i in range(self._position + 1, self._next):
                budget -= self._sizes[self._plan[i]]
            while self._next < len(self._plan):
                if not self._first_done and any(not f.done() for f in self._started.values()):
                    break
                shard = self._plan[self._next]
                size = self._sizes[shard]
                if size > budget and self._next > self._position + 1:
                    break
                budget -= size
                self._next += 1
                if shard not in self._started:
                    future = self._pool.submit(self._run, shard)
                    self._started[shard] = future

    def _run(self, shard: int) -> None:
        try:
            self._fetch(shard)
        except Exception:
            pass  # the reader's own fetch retries it and reports the error
        self._first_done = True
        self._submit()

    def close(self) -> None:
        """Stop: downloads not yet started are dropped, running ones finish."""
        with self._lock:
            self._plan = []
        self._pool.shutdown(wait=False, cancel_futures=True)
