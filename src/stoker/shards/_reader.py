"""Per-process memory maps of shard files, verified against the index.

A :class:`ShardReader` maps each shard on first use in the current process (the pid is
checked, so a forked worker never uses its parent's maps) and drops its maps when pickled.
Verification modes:

``"full"``  every shard is hashed when the reader is created;
``"lazy"``  a shard is hashed the first time this process touches it;
``"off"``   no hashing; sizes and member bounds are still checked.

A shard must be a regular file at least as large as the index says (every member lies within
that size, :func:`stoker.shards._index.read_index` checked): it is opened non-blocking, so a
FIFO under a shard's name is an error rather than a hang.

A sha256 mismatch is located with the per-chunk CRC-32 of the index and reported with the
shard, the byte range and the member it falls in.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import weakref
import zlib
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from stoker.errors import ConfigError
from stoker.shards._errors import CorruptShardError, ShardError
from stoker.shards._files import open_regular
from stoker.shards._index import ShardIndex, ShardInfo
from stoker.store._cache import Pin

__all__ = ["MAX_REMOTE_MAPS", "ShardOpener", "ShardReader", "Verify"]

#: Shards of a remote dataset one process keeps mapped: an older map is dropped before the next
#: shard is fetched (its cache pin released once no sample views it), so a budget of this many
#: shards per reading process always lets every reader go on.
MAX_REMOTE_MAPS = 2


class ShardOpener(Protocol):
    """Where a remote dataset's shards come from (``stoker.shards._remote.RemoteShards``)."""

    def open(self, number: int) -> Pin: ...


Verify = Literal["lazy", "full", "off"]
_VERIFY_MODES: tuple[str, ...] = get_args(Verify)
_FIX = (
    "re-copy or re-pack the shard (`stoker pack`), or if it was changed on purpose rebuild "
    "the index with `stoker index {dir}`."
)


class ShardReader:
    """Memory-mapped, checksummed access to the shards of one directory.

    Args:
        directory: the shard directory.
        index: its index.
        verify: ``"lazy"``, ``"full"`` or ``"off"`` (see the module docstring).
        opener: for a remote dataset, gives each shard's cached file, pinned while mapped.
            Default ``None``: shards are files in ``directory``.

    Raises:
        ConfigError: for an unknown ``verify``.
        CorruptShardError: with ``verify="full"``, for the first bad shard.
    """

    def __init__(
        self, directory: Path, index: ShardIndex, verify: Verify, opener: ShardOpener | None = None
    ) -> None:
        if verify not in _VERIFY_MODES:
            raise ConfigError(
                f"`verify` must be one of {', '.join(map(repr, _VERIFY_MODES))}. Found: {verify!r}."
            )
        self.directory = directory
        self.index = index
        self.verify = verify
        self.opener = opener
        self._pid = os.getpid()
        self._maps: dict[int, tuple[mmap.mmap | None, memoryview]] = {}
        self._checked: set[int] = set()
        if verify == "full":
            for number in range(len(index.shards)):
                self.view(number)

    def path(self, number: int) -> Path:
        """Path of shard ``number``."""
        return self.directory / self.index.shards[number].name

    def view(self, number: int) -> memoryview:
        """A read-only view of shard ``number``'s bytes, mapped and checked on first use.

        Raises:
            CorruptShardError: if the shard is missing, truncated or (when verifying) differs
                from the index.
            ShardError: if it is not a regular file (a FIFO, a folder) or cannot be opened.
        """
        if self._pid != os.getpid():
            self._maps, self._checked, self._pid = {}, set(), os.getpid()
        entry = self._maps.get(number)
        if entry is None:
            if self.opener is None:
                entry = self._map(number, self.path(number))
            else:
                # Unpin first: a reader waiting for room in a full cache must not hold it.
                while len(self._maps) >= MAX_REMOTE_MAPS:
                    _unmap(self._maps.pop(next(iter(self._maps))))
                entry = self._map_pinned(number, self.opener.open(number))
            self._maps[number] = entry
        return entry[1]

    def _map_pinned(self, number: int, pin: Pin) -> tuple[mmap.mmap | None, memoryview]:
        try:
            entry = self._map(number, pin.path)
        except BaseException:
            pin.release()
            raise
        if entry[0] is None:
            pin.release()
        else:  # held until the last sample viewing the map is gone
            weakref.finalize(entry[0], pin.release)
        return entry

    def _map(self, number: int, path: Path) -> tuple[mmap.mmap | None, memoryview]:
        info = self.index.shards[number]
        try:
            fd, st = open_regular(path)
        except FileNotFoundError:
            raise CorruptShardError(
                f"shard {str(path)!r} is missing (the index lists it with {info.samples} samples): "
                + _FIX.format(dir=self.directory),
                shard=str(path),
                offset=0,
            ) from None
        except OSError as exc:
            raise ShardError(f"shard {str(path)!r} cannot be opened ({exc}).") from exc
        mm: mmap.mmap | None = None
        try:
            if st.st_size < info.size:
                self._raise_truncated(info, path, st.st_size)
            if st.st_size:  # an empty file cannot be mapped
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        view = memoryview(mm) if mm is not None else memoryview(b"")
        if self.verify != "off" and number not in self._checked:
            try:
                self._check(info, path, view)
            except CorruptShardError:
                view.release()
                if mm is not None:
                    mm.close()
                raise
            self._checked.add(number)
        return mm, view

    def _raise_truncated(self, info: ShardInfo, path: Path, size: int) -> None:
        member = info.member_at(size)
        where = f", inside member {member[0]!r} (data at byte offset {member[1]})" if member else ""
        raise CorruptShardError(
            f"shard {str(path)!r} is truncated: {size} bytes, the index expects {info.size}; "
            f"data ends at byte offset {size}{where}. " + _FIX.format(dir=self.directory),
            shard=str(path),
            offset=size,
        )

    def _check(self, info: ShardInfo, path: Path, view: memoryview) -> None:
        if len(view) != info.size:
            self._raise_truncated(info, path, len(view))
        if hashlib.sha256(view).hexdigest() == info.sha256:
            return
        step = info.chunk_size
        for i, expected in enumerate(info.chunk_crc32):
            if zlib.crc32(view[i * step : (i + 1) * step]) != expected:
                start, end = i * step, min((i + 1) * step, info.size)
                member = info.member_at(start)
                where = (
                    f", in or after member {member[0]!r} (data at byte offset {member[1]}, "
                    f"{member[2]} bytes)"
                    if member
                    else " (tar headers or end-of-archive blocks)"
                )
                raise CorruptShardError(
                    f"shard {str(path)!r} is corrupt at byte offset {start}: "
                    f"bytes {start}..{end - 1} "
                    f"differ from the index (CRC-32 of that chunk){where}. "
                    + _FIX.format(dir=self.directory),
                    shard=str(path),
                    offset=start,
                )
        raise CorruptShardError(
            f"shard {str(path)!r} does not match its sha256 in the index, though every chunk "
            "checksum does (the index itself may be damaged). " + _FIX.format(dir=self.directory),
            shard=str(path),
            offset=0,
        )

    def close(self) -> None:
        """Unmap this process's shards (views still held by samples keep theirs alive)."""
        maps, self._maps = self._maps, {}
        if self._pid != os.getpid():
            return
        for entry in maps.values():
            _unmap(entry)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"], state["_checked"] = {}, set()
        return state


def _unmap(entry: tuple[mmap.mmap | None, memoryview]) -> None:
    mm, view = entry
    try:
        view.release()
        if mm is not None:
            mm.close()
    except BufferError:
        pass  # a sample still references it; it is unmapped when collected
