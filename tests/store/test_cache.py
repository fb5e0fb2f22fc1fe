"""The shard cache on its own: a private folder, a budget that never evicts a pinned shard."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import threading
from pathlib import Path

import pytest

from stoker.errors import ConfigError
from stoker.store import ShardCache, StoreError, StoreURL, _cache, open_store, parse_url

# Bound on each wait for the download thread (it takes milliseconds).
LIMIT_S = 10.0


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


def _locked(path: Path) -> bool:
    """Whether another open file holds a lock on ``path`` (tried exclusive, non-blocking)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _forked(child) -> tuple[int, int]:
    """Run ``child()`` in a forked child, which then waits on a pipe; returns once it ran, with
    the pid and the pipe's write end (closing it lets the child exit)."""
    r, w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            signal.alarm(CHILD_LIMIT_S)  # a hard limit, whatever the parent does
            os.close(w)
            child()
            os.write(done_w, b"1")
            os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)
    os.close(done_w)
    try:
        assert os.read(done_r, 1) == b"1"
    finally:
        os.close(done_r)
    return pid, w


CHILD_LIMIT_S = 20


def _end(pid: int, w: int) -> None:
    os.close(w)
    os.waitpid(pid, 0)


def test_locks_are_released_though_a_forked_child_holds_a_copy_of_their_fd(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "x.lock"
    with _cache._flock(lock, fcntl.LOCK_EX):
        pid, w = _forked(lambda: None)  # forked mid-download: it inherits the lock's fd
    try:
        assert not _locked(lock)  # the parent's release did not wait for the child's copy
    finally:
        _end(pid, w)


def test_a_forked_childs_release_of_an_inherited_pin_leaves_the_parents(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache")
    data = b"s" * 100
    digest = hashlib.sha256(data).hexdigest()
    cache._setup()
    cache.path(digest).write_bytes(data)
    pin = cache.pin(digest, len(data))
    assert pin is not None
    pid, w = _forked(pin.release)  # a worker dropping the maps it inherited
    try:
        assert _locked(pin.path)  # still pinned against eviction for the parent
        pin.release()
        assert not _locked(pin.path)
    finally:
        _end(pid, w)


class _Paused:
    """A store whose downloads wait, once they have their bytes, until the test lets them go."""

    def __init__(self, store) -> None:
        self.store, self.url = store, store.url
        self.loaded, self.go = threading.Event(), threading.Event()

    def download(self, name: str, out, size: int) -> str:
        digest = self.store.download(name, out, size)
        self.loaded.set()
        self.go.wait(LIMIT_S)
        return digest


def test_a_download_is_renamed_into_place_under_the_cache_lock(
    s3_server, bucket: str, tmp_path: Path
) -> None:
    """Every count of the budget lists the folder under the cache lock; a listing taken while a
    download was renamed could hold neither name (ext4 lists by hash), count a shard short and
    let one more in: five shards in a budget of four, in CI."""
    a = _put(s3_server.client(), bucket, "a.tar", b"a" * 4000)
    url = parse_url(f"s3://{bucket}/c")
    assert isinstance(url, StoreURL)
    store = _Paused(open_store(url))
    cache = ShardCache(tmp_path / "cache", limit=6000)
    pins: list = []
    fetching = threading.Thread(target=lambda: pins.append(cache.fetch(store, *a)))
    fetching.start()
    try:
        assert store.loaded.wait(LIMIT_S)
        with _cache._flock(cache.directory / "cache.lock", fcntl.LOCK_EX):
            store.go.set()
            fetching.join(0.3)
            assert fetching.is_alive() and not cache.path(a[2]).exists()  # waits for the lock
        fetching.join(LIMIT_S)
        assert not fetching.is_alive() and pins[0].path == cache.path(a[2])
        assert pins[0].path.read_bytes() == b"a" * 4000
    finally:
        store.go.set()
        fetching.join(LIMIT_S)
        for pin in pins:
            pin.release()
