"""The shard cache on its own: a private folder, a budget that never evicts a pinned shard."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from stoker.errors import ConfigError
from stoker.store import ShardCache, StoreError, StoreURL, _cache, open_store, parse_url


def _put(s3_client, bucket: str, name: str, data: bytes) -> tuple[str, int, str]:
    s3_client.put_object(Bucket=bucket, Key=f"c/{name}", Body=data)
    return name, len(data), hashlib.sha256(data).hexdigest()


def test_a_cache_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    cache = ShardCache(shared)
    with pytest.raises(ConfigError, match="chmod 700"):
        cache.pin("0" * 64, 1)


def test_the_default_folder_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ShardCache().directory == tmp_path / "stoker"


def test_a_pinned_shard_is_never_evicted(
    s3_server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_cache, "ROOM_TIMEOUT_SECONDS", 0.3)
    client = s3_server.client()
    a = _put(client, bucket, "a.tar", b"a" * 4000)
    b = _put(client, bucket, "b.tar", b"b" * 4000)
    url = parse_url(f"s3://{bucket}/c")
    assert isinstance(url, StoreURL)
    store = open_store(url)
    cache = ShardCache(tmp_path / "cache", limit=6000)  # room for one
    pin = cache.fetch(store, *a)
    assert pin is not None and pin.path.read_bytes() == b"a" * 4000
    assert cache.fetch(store, *b, wait=False) is None  # no room: a prefetch gives up at once
    with pytest.raises(StoreError, match="cache_limit"):
        cache.fetch(store, *b)  # waits for room, then says why
    assert pin.path.exists()
    pin.release()
    pin_b = cache.fetch(store, *b)  # a, no longer pinned, is evicted
    assert pin_b is not None and not pin.path.exists() and cache.usage() <= 6000
    pin_b.release()
    with pytest.raises(ConfigError, match="smaller than one shard"):
        ShardCache(tmp_path / "small", limit=100).fetch(store, *a)
