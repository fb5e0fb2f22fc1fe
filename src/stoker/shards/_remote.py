"""Shards that live in object storage: the index fetched, shards cached whole on first use.

:class:`RemoteShards` is what a :class:`~stoker.shards.ShardDataset` built from a URL reads
through: it fetches ``index.json`` (at most :data:`~stoker.shards._index.MAX_INDEX_BYTES`,
validated as a local one is), hands the reader a pinned local file for each shard from the
:class:`~stoker.store.ShardCache`, and runs a :class:`~stoker.store.Prefetcher` in each reading
process once a stream tells it which shards come next. It pickles without its threads, pins or
client, so every worker builds its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from stoker.shards._errors import CorruptShardError, IncompleteShardsError, ShardError
from stoker.shards._index import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    PACK_STATE_NAME,
    ShardIndex,
    load_index,
)
from stoker.store import (
    ObjectMismatchError,
    ObjectMissingError,
    Prefetcher,
    ShardCache,
    StoreURL,
    open_store,
)
from stoker.store._cache import Pin
from stoker.store._prefetch import DEFAULT_AHEAD_BYTES

__all__ = ["RemoteShards"]


class RemoteShards:
    """The shards of one store prefix, through a local cache.

    Args:
        url: the dataset's prefix.
        cache: the local cache.

    Raises:
        IncompleteShardsError: the prefix has no ``index.json`` (naming an interrupted pack).
        ShardError: the index is invalid or too large.
        StoreError: the store failed (after retries).
    """

    def __init__(self, url: StoreURL, cache: ShardCache) -> None:
        self.url = url
        self.cache = cache
        self.store = open_store(url)
        self.index = self._fetch_index()
        self._pid = os.getpid()
        self._prefetcher: Prefetcher | None = None
        self._reading = -1

    def _fetch_index(self) -> ShardIndex:
        fix = f"Re-pack it with `stoker pack SRC {self.url}`."
        try:
            data = self.store.get(INDEX_NAME, MAX_INDEX_BYTES)
        except ObjectMissingError:
            if self.store.exists(PACK_STATE_NAME):
                raise IncompleteShardsError(
                    f"{self.url} holds an interrupted pack (no {INDEX_NAME}, a {PACK_STATE_NAME}): "
                    f"finish it with `stoker pack --resume SRC {self.url}`."
                ) from None
            raise IncompleteShardsError(
                f"{self.url.url(INDEX_NAME)} does not exist: write shards there with "
                f"`stoker pack SRC {self.url}`."
            ) from None
        except ObjectMismatchError as exc:
            raise ShardError(f"{exc} It is not an index stoker wrote. {fix}") from None
        return load_index(data, self.url.url(INDEX_NAME), fix)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_prefetcher": None, "_reading": -1}

    def _here(self) -> None:
        if self._pid != os.getpid():  # a forked worker: its parent's threads are not here
            self._pid, self._prefetcher, self._reading = os.getpid(), None, -1

    def open(self, number: int) -> Pin:
        """Shard ``number`` in the cache (downloaded if absent), pinned against eviction.

        Raises:
            CorruptShardError: its bytes differed from the index in two downloads.
            StoreError: the store failed (after retries) or the cache budget is too small.
        """
        self._here()
        info = self.index.shards[number]
        try:
            pin = self.cache.fetch(self.store, info.name, info.size, info.sha256)
            assert pin is not None  # fetch waits for room unless told not to
            return pin
        except ObjectMismatchError as exc:
            raise CorruptShardError(
                f"shard {exc.url} differs from its index (downloaded twice): {exc} Re-pack "
                f"it with `stoker pack SRC {self.url}`, or rebuild the index if it was changed "
                "on purpose.",
                shard=exc.url,
                offset=0,
            ) from None
        except ObjectMissingError:
            raise CorruptShardError(
                f"shard {self.url.url(info.name)} is missing from the store (the index lists it "
                f"with {info.samples} samples): re-pack with `stoker pack SRC {self.url}`.",
                shard=self.url.url(info.name),
                offset=0,
            ) from None

    def _prefetch_one(self, number: int) -> None:
        info = self.index.shards[number]
        pin = self.cache.fetch(self.store, info.name, info.size, info.sha256, wait=False)
        if pin is not None:  # else no room yet, or another process has it: the reader fetches it
            pin.release()

    def plan(self, shards: Sequence[int]) -> None:
        """Start downloading ``shards`` (numbers, in reading order) ahead of the reader."""
        self._here()
        if self._prefetcher is None:
            self._prefetcher = Prefetcher(
                self._prefetch_one, [s.size for s in self.index.shards], **_prefetch_bounds(self)
            )
        self._prefetcher.plan(shards)

    def reading(self, number: int) -> None:
        """The reader is at shard ``number``: keep the prefetch ahead of it."""
        if number != self._reading:
            self._reading = number
            if self._prefetcher is not None and self._pid == os.getpid():
                self._prefetcher.reading(number)

    def close(self) -> None:
        if self._prefetcher is not None and self._pid == os.getpid():
            self._prefetcher.close()
        self._prefetcher = None


def _prefetch_bounds(remote: RemoteShards) -> dict[str, int]:
    # Ahead of the reader by at most half the budget, so prefetched shards never push out the
    # ones being read.
    limit = remote.cache.limit
    return {
        "ahead_bytes": DEFAULT_AHEAD_BYTES
        if limit is None
        else min(DEFAULT_AHEAD_BYTES, limit // 2)
    }
