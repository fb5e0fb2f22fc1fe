"""Object storage: URLs, a retrying client, and a local cache of whole shards.

::

    s3://bucket/prefix  -> parse_url() -> StoreURL -> Store (obstore; retries, backoff, jitter)
                                                       |
    ShardCache(cache_dir, cache_limit):  Store.download -> private temp file -> verify size
        and sha256 -> rename; LRU eviction under one cache lock; a file mapped by any process
        holds a shared flock and is never evicted; one download per shard per machine
    Prefetcher: background downloads in the reading process, in the sampler's order, with
        bounded concurrency and bytes in flight

This package imports nothing of stoker but :mod:`stoker.errors`; the shards package builds on
it.
"""

from __future__ import annotations

from stoker.store._cache import ShardCache, default_cache_dir, parse_bytes
from stoker.store._client import Store, open_store
from stoker.store._errors import ObjectMismatchError, ObjectMissingError, StoreError, StoreURLError
from stoker.store._prefetch import Prefetcher
from stoker.store._retry import RetryPolicy, with_retries
from stoker.store._secrets import scrub
from stoker.store._url import StoreURL, is_url, local_path, parse_url, redact

__all__ = [
    "ObjectMismatchError",
    "ObjectMissingError",
    "Prefetcher",
    "RetryPolicy",
    "ShardCache",
    "Store",
    "StoreError",
    "StoreURL",
    "StoreURLError",
    "default_cache_dir",
    "is_url",
    "local_path",
    "open_store",
    "parse_bytes",
    "parse_url",
    "redact",
    "scrub",
    "with_retries",
]
