"""A machine-local cache of whole shards, shared by every process and rank, within a budget.

Layout under ``cache_dir`` (created 0700; refused when another user owns it or may write it)::

    objects/<sha256>                a complete shard, verified; its name is its checksum, so a
                                    re-packed dataset never reads a stale file
    objects/.<sha256>.<random>.tmp  a download in progress (O_EXCL|O_NOFOLLOW, 0600), sized to
                                    the shard up front so the space is reserved
    locks/<sha256>.lock             held (flock) while that shard downloads: one download per
                                    shard per machine, the others wait and then read the file
    cache.lock                      held while space is reserved and files evicted

A process that maps a shard holds a shared flock on it (:class:`Pin`); eviction takes an
exclusive non-blocking flock first and skips what it cannot lock, so a mapped shard is never
evicted. Least recently used goes first (the modification time is touched on every use). A
temporary file whose lock nobody holds belongs to a process that died, and is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stoker.errors import ConfigError
from stoker.store._client import Store
from stoker.store._errors import ObjectMismatchError, StoreError

__all__ = [
    "ROOM_POLL_SECONDS",
    "ROOM_TIMEOUT_SECONDS",
    "Pin",
    "ShardCache",
    "default_cache_dir",
    "parse_bytes",
]

#: How long a download waits for pinned shards to be released before the budget is an error.
ROOM_TIMEOUT_SECONDS = 60.0
ROOM_POLL_SECONDS = 0.05
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_TMP_RE = re.compile(r"\.([0-9a-f]{64})\.[0-9a-f]+\.tmp")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_bytes(value: int | str | None, what: str = "cache_limit") -> int | None:
    """``"20GB"`` -> 20_000_000_000, ``"1GiB"`` -> 2**30, an int as is, ``None`` for no limit.

    Raises:
        ConfigError: naming ``what`` and the value.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _SIZE_RE.match(value) if isinstance(value, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(
            f"`{what}` must be a positive number of bytes or a size such as '20GB' or '512MiB'. "
            f"Found: {value!r}."
        )
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stoker"


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"`cache_dir` {str(path)!r} is not a folder: pass a folder.")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise ConfigError(
            f"`cache_dir` {str(path)!r} belongs to another user or others may write to it "
            f"(mode 0o{st.st_mode & 0o777:o}): pass a folder of your own (`chmod 700` it)."
        )


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        # Unlocked before the close: a child forked meanwhile holds a copy of the fd, and the
        # lock would last until it closed that too (the lock is the open file's, not the fd's).
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _try_flock(path: Path, mode: int) -> int | None:
    """An open fd holding ``mode`` (non-blocking) on ``path``, or ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@dataclass
class Pin:
    """A cached shard held against eviction: a shared flock on its file until :meth:`release`.

    Attributes:
        path: the cached file.
        fd: the open descriptor holding the lock (``-1`` once released).
        pid: the process that took it.
    """

    path: Path
    fd: int
    pid: int = field(default_factory=os.getpid)

    def release(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            # Unlocked by its own process only: a child forked meanwhile shares the lock
            # through its copy of the fd (its release must not unpin the parent's map), and
            # the parent's must not wait for the child to close that copy.
            if self.pid == os.getpid():
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class ShardCache:
    """Whole shards on a local disk, verified, shared by processes, within a byte budget.

    Args:
        directory: the cache folder. Default ``None``: :func:`default_cache_dir`.
        limit: the budget in bytes, or a size string (``"20GB"``). Default ``None``: no limit.

    Raises:
        ConfigError: for a bad ``limit``, or a folder that is not the user's own.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None,
                 limit: int | str | None = None) -> None:  # fmt: skip
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.limit = parse_bytes(limit)
        self._made = False

    def _setup(self) -> None:
        if not self._made:
            _private_dir(self.directory)
            for sub in ("objects", "locks"):
                _private_dir(self.directory / sub)
            self._made = True

    def path(self, sha256: str) -> Path:
        if not _SHA_RE.fullmatch(sha256):
            raise StoreError(f"`sha256` must be 64 lower-case hex digits. Found: {sha256!r}.")
        return self.directory / "objects" / sha256

    def usage(self) -> int:
        """Bytes held by the cache's files (downloads in progress included)."""
        total = 0
        with os.scandir(self.directory / "objects") as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    total += entry.stat(follow_symlinks=False).st_size
        return total

    def pin(self, sha256: str, size: int) -> Pin | None:
        """The cached shard, held against eviction and marked used, or ``None`` if absent."""
        self._setup()
        path = self.path(sha256)
        fd = _try_flock(path, fcntl.LOCK_SH)
        if fd is None:
            return None
        st = os.fstat(fd)
        try:
            current = os.lstat(path)
        except FileNotFoundError:
            current = None
        # Evicted between open and lock, or not what we wrote: treat as absent.
        if current is None or current.st_ino != st.st_ino or not stat.S_ISREG(st.st_mode) \
                or st.st_size != size:  # fmt: skip
            os.close(fd)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return Pin(path, fd)

    def fetch(
        self, store: Store, name: str, size: int, sha256: str, *, wait: bool = True
    ) -> Pin | None:
        """The shard ``name`` of ``store``, downloaded once per machine, pinned.

        A download whose bytes differ from ``size``/``sha256`` is tried once more. With
        ``wait=False`` (prefetch), returns ``None`` at once when the budget has no room or
        another process is downloading the shard, instead of waiting.

        Raises:
            ObjectMismatchError: the object differs from the index twice in a row.
            StoreError: the store failed (after retries), or the budget cannot hold the shard.
        """
        pin = self.pin(sha256, size)
        if pin is not None:
            return pin
        lock = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
        try:
            with _flock(self.directory / "locks" / f"{sha256}.lock", lock):
                pin = self.pin(sha256, size)
                if pin is not None:
                    return pin
                # Pinned from before its rename: another process making room could otherwise
                # evict it between the rename and a pin taken after.
                try:
                    return self._download(store, name, size, sha256, wait)
                except ObjectMismatchError:
                    return self._download(store, name, size, sha256, wait)  # once more
        except BlockingIOError:
            return None  # another process is downloading it

    def _download(self, store: Store, name: str, size: int, sha256: str, wait: bool) -> Pin | None:
        """Download into a temporary file, verify it, pin it and rename it into place;
        ``None`` when there is no room and ``wait`` is false."""
        final = self.path(sha256)
        tmp = final.with_name(f".{sha256}.{secrets.token_hex(8)}.tmp")
        if not self._reserve(size, lambda: _create_sized(tmp, size), wait):
            return None
        try:
            with open(os.open(tmp, os.O_RDWR | _O_NOFOLLOW | _O_CLOEXEC), "r+b") as out:
                digest = store.download(name, out, size)
            if digest != sha256:
                raise ObjectMismatchError(
                    f"{store.url.url(name)}: its sha256 differs from the index "
                    f"({digest[:12]}... != {sha256[:12]}...)",
                    url=store.url.url(name),
                )
            fd = os.open(tmp, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)  # the pin: the lock follows the file's rename
                # Under the cache lock: a directory listing taken during a rename may hold
                # neither name, and an eviction that counted one shard short let another in
                # (five 10 KiB shards in a 40 KiB budget, in CI).
                with _flock(self.directory / "cache.lock", fcntl.LOCK_EX):
                    os.replace(tmp, final)
            except BaseException:
                os.close(fd)
                raise
            return Pin(final, fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _reserve(self, size: int, create: Callable[[], None], wait: bool) -> bool:
        """Make room for ``size`` bytes, then ``create`` the file that holds them, under the
        cache lock, so that no two processes count the same free bytes. Without ``wait``,
        returns ``False`` at once when there is no room."""
        if self.limit is not None and size > self.limit:
            raise ConfigError(
                f"`cache_limit` ({self.limit} bytes) is smaller than one shard ({size} bytes): "
                "raise it to at least a few shards."
            )
        deadline = time.monotonic() + ROOM_TIMEOUT_SECONDS
        while True:
            with _flock(self.directory / "cache.lock", fcntl.LOCK_EX):
                if self.limit is None or self._evict(self.limit - size):
                    create()
                    return True
            if not wait:
                return False
            if time.monotonic() > deadline:
                raise StoreError(
                    f"`cache_limit` ({self.limit} bytes) cannot hold another {size}-byte shard: "
                    f"the shards mapped by readers fill it ({self.usage()} bytes in "
                    f"{self.directory}). Raise `cache_limit` or use fewer workers."
                )
            time.sleep(ROOM_POLL_SECONDS)

    def _evict(self, target: int) -> bool:
        """Remove stale temporaries, then least recently used unpinned shards, until the cache
        holds at most ``target`` bytes. Returns whether it does."""
        objects = self.directory / "objects"
        entries: list[tuple[float, int, Path]] = []
        used = 0
        for entry in os.scandir(objects):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            tmp = _TMP_RE.fullmatch(entry.name)
            if tmp is not None:
                if self._stale(tmp.group(1)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    continue
            elif _SHA_RE.fullmatch(entry.name):
                entries.append((st.st_mtime, st.st_size, Path(entry.path)))
            used += st.st_size
        for _, size, path in sorted(entries):
            if used <= target:
                break
            fd = _try_flock(path, fcntl.LOCK_EX)
            if fd is None:
                continue  # mapped by a reader
            try:
                path.unlink()
                used -= size
            finally:
                os.close(fd)
        return used <= target

    def _stale(self, sha256: str) -> bool:
        fd = _try_flock(self.directory / "locks" / f"{sha256}.lock", fcntl.LOCK_EX)
        if fd is None:
            return False
        os.close(fd)
        return True

    def __repr__(self) -> str:
        return f"ShardCache({str(self.directory)!r}, limit={self.limit})"


def _create_sized(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
