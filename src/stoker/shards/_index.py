"""``index.json``: what a shard directory holds and where every member's bytes are.

Schema (version 1)::

    {"format": "stoker.shards", "version": 1, "samples": N, "meta": {...},
     "shards": [{"name": "shard-000000.tar", "size": BYTES, "sha256": HEX,
                 "samples": n, "keys": [...],
                 "fields": [["cls", "jpg"], ...],    # distinct extension lists
                 "pattern": [0, 0, ...],             # per sample: its entry in "fields"
                 "offsets": [...], "sizes": [...],   # per member: data offset and size
                 "chunk_size": 65536, "chunk_crc32": [...]}, ...]}

``chunk_crc32`` holds the CRC-32 of every ``chunk_size`` bytes of the shard, so that a
corrupted byte can be located to a chunk and a member once the sha256 disagrees. The file is
written atomically and deterministically (sorted keys, no timestamps).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stoker.shards._errors import IncompleteShardsError, ShardError
from stoker.shards._tar import scan_tar, split_name

__all__ = [
    "CHUNK_SIZE",
    "FORMAT",
    "INDEX_NAME",
    "PACK_STATE_NAME",
    "VERSION",
    "ShardIndex",
    "ShardInfo",
    "build_index",
    "describe_shard",
    "read_index",
    "write_index",
]

FORMAT = "stoker.shards"
VERSION = 1
INDEX_NAME = "index.json"
PACK_STATE_NAME = ".stoker-pack.json"
CHUNK_SIZE = 1 << 16
_READ_SIZE = 1 << 22


@dataclass(frozen=True, eq=False)
class ShardInfo:
    """One shard as the index describes it.

    Attributes:
        name: file name inside the directory.
        size: file size in bytes.
        sha256: hex digest of the whole file.
        keys: sample keys in shard order.
        fields: distinct extension lists; ``pattern[i]`` picks sample ``i``'s list.
        pattern: per-sample index into ``fields``.
        offsets: per-member data offset (int64), samples' members contiguous.
        sizes: per-member data size (int64).
        chunk_size: bytes per ``chunk_crc32`` entry.
        chunk_crc32: CRC-32 of each chunk of the file.
        starts: per-sample index of its first member (length ``samples + 1``), derived.
    """

    name: str
    size: int
    sha256: str
    keys: tuple[str, ...]
    fields: tuple[tuple[str, ...], ...]
    pattern: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    chunk_size: int
    chunk_crc32: tuple[int, ...]
    starts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if len(self.pattern) != len(self.keys):
            raise ValueError(f"{self.name}: {len(self.keys)} keys but {len(self.pattern)} patterns")
        lengths = np.array([len(f) for f in self.fields], dtype=np.int64)
        counts = lengths[self.pattern] if len(self.pattern) else np.zeros(0, np.int64)
        starts = np.zeros(len(self.keys) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        if starts[-1] != len(self.offsets) or len(self.offsets) != len(self.sizes):
            raise ValueError(
                f"{self.name}: the samples' fields name {int(starts[-1])} members but there are "
                f"{len(self.offsets)} offsets and {len(self.sizes)} sizes"
            )
        if len(self.offsets) and int((self.offsets + self.sizes).max()) > self.size:
            raise ValueError(f"{self.name}: a member ends past the shard's size {self.size}")
        object.__setattr__(self, "starts", starts)

    @property
    def samples(self) -> int:
        """Number of samples in the shard."""
        return len(self.keys)

    def members(self, local: int) -> list[tuple[str, int, int]]:
        """``(ext, data offset, size)`` of sample ``local``'s members."""
        lo, hi = int(self.starts[local]), int(self.starts[local + 1])
        exts = self.fields[int(self.pattern[local])]
        return [(exts[j - lo], int(self.offsets[j]), int(self.sizes[j])) for j in range(lo, hi)]

    def member_at(self, offset: int) -> tuple[str, int, int] | None:
        """The member whose data holds byte ``offset``, else the next member after it."""
        j = int(np.searchsorted(self.offsets + self.sizes, offset, side="right"))
        if j >= len(self.offsets):
            return None
        sample = int(np.searchsorted(self.starts, j, side="right")) - 1
        ext = self.fields[int(self.pattern[sample])][j - int(self.starts[sample])]
        return f"{self.keys[sample]}.{ext}", int(self.offsets[j]), int(self.sizes[j])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "sha256": self.sha256,
            "samples": self.samples,
            "keys": list(self.keys),
            "fields": [list(f) for f in self.fields],
            "pattern": self.pattern.tolist(),
            "offsets": self.offsets.tolist(),
            "sizes": self.sizes.tolist(),
            "chunk_size": self.chunk_size,
            "chunk_crc32": list(self.chunk_crc32),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ShardInfo:
        info = cls(
            name=str(obj["name"]),
            size=int(obj["size"]),
            sha256=str(obj["sha256"]),
            keys=tuple(map(str, obj["keys"])),
            fields=tuple(tuple(map(str, f)) for f in obj["fields"]),
            pattern=np.asarray(obj["pattern"], dtype=np.int64),
            offsets=np.asarray(obj["offsets"], dtype=np.int64),
            sizes=np.asarray(obj["sizes"], dtype=np.int64),
            chunk_size=int(obj["chunk_size"]),
            chunk_crc32=tuple(int(c) for c in obj["chunk_crc32"]),
        )
        if int(obj["samples"]) != info.samples or "/" in info.name or info.chunk_size <= 0:
            raise ValueError(f"{info.name}: inconsistent 'samples', 'name' or 'chunk_size'")
        if len(info.pattern) and (info.pattern.min() < 0 or info.pattern.max() >= len(info.fields)):
            raise ValueError(f"{info.name}: 'pattern' points outside 'fields'")
        if len(info.chunk_crc32) != -(-info.size // info.chunk_size):
            raise ValueError(f"{info.name}: {len(info.chunk_crc32)} chunk checksums")
        return info


@dataclass(frozen=True, eq=False)
class ShardIndex:
    """A shard directory's index.

    Attributes:
        shards: the shards in order; sample ``i`` of the dataset is found by counting.
        meta: free-form metadata from the packer (e.g. ``classes`` of an image folder).
    """

    shards: tuple[ShardInfo, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        """Total number of samples."""
        return sum(s.samples for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "samples": self.samples,
            "meta": dict(self.meta),
            "shards": [s.to_json() for s in self.shards],
        }


def file_checksums(
    path: str | os.PathLike[str], chunk_size: int = CHUNK_SIZE
) -> tuple[str, list[int]]:
    """sha256 of a whole file and CRC-32 of each ``chunk_size`` chunk, in one pass."""
    digest = hashlib.sha256()
    crcs: list[int] = []
    read = max(chunk_size, _READ_SIZE // chunk_size * chunk_size)
    with open(path, "rb") as f:
        while block := f.read(read):
            digest.update(block)
            view = memoryview(block)
            crcs += [zlib.crc32(view[i : i + chunk_size]) for i in range(0, len(view), chunk_size)]
    return digest.hexdigest(), crcs


def describe_shard(path: str | os.PathLike[str]) -> ShardInfo:
    """Scan one tar file and describe it as an index entry.

    Members are grouped into samples as WebDataset groups them (consecutive members with the
    same key); members without an extension, and non-regular entries, are skipped.

    Args:
        path: the tar file.

    Returns:
        The :class:`ShardInfo`.

    Raises:
        ShardError: if the file is not a readable uncompressed tar, or a key repeats an
            extension.
    """
    path = Path(path)
    try:
        entries = scan_tar(str(path))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ShardError(
            f"{path} is not a readable uncompressed tar archive ({exc}): shards must be plain "
            "`.tar` files (decompress `.tar.gz` first)."
        ) from exc
    keys: list[str] = []
    exts: list[list[str]] = []
    offsets: list[int] = []
    sizes: list[int] = []
    for entry in entries:
        split = split_name(entry.name)
        if split is None:
            continue
        key, ext = split
        if not keys or keys[-1] != key:
            keys.append(key)
            exts.append([])
        elif ext in exts[-1]:
            raise ShardError(
                f"{path}: member {entry.name!r} at byte offset {entry.offset} repeats extension "
                f"{ext!r} of key {key!r}; WebDataset rejects such shards too."
            )
        exts[-1].append(ext)
        offsets.append(entry.data_offset)
        sizes.append(entry.size)
    table: dict[tuple[str, ...], int] = {}
    pattern = [table.setdefault(tuple(e), len(table)) for e in exts]
    sha, crcs = file_checksums(path)
    return ShardInfo(
        name=path.name,
        size=path.stat().st_size,
        sha256=sha,
        keys=tuple(keys),
        fields=tuple(table),
        pattern=np.asarray(pattern, dtype=np.int64),
        offsets=np.asarray(offsets, dtype=np.int64),
        sizes=np.asarray(sizes, dtype=np.int64),
        chunk_size=CHUNK_SIZE,
        chunk_crc32=tuple(crcs),
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_index(directory: str | os.PathLike[str], index: ShardIndex) -> Path:
    """Write ``index.json`` atomically (deterministic bytes for the same index).

    Returns:
        The index path.
    """
    path = Path(directory) / INDEX_NAME
    text = json.dumps(index.to_json(), sort_keys=True, separators=(",", ":"))
    write_atomic(path, text.encode() + b"\n")
    return path


def read_index(directory: str | os.PathLike[str]) -> ShardIndex:
    """Read and validate a directory's ``index.json``.

    Args:
        directory: the shard directory.

    Returns:
        The :class:`ShardIndex`.

    Raises:
        IncompleteShardsError: if there is no index (naming `stoker pack --resume` when an
            interrupted pack is found, `stoker index` when foreign tar files are).
        ShardError: if the index cannot be parsed or is inconsistent.
    """
    directory = Path(directory)
    path = directory / INDEX_NAME
    if not directory.exists():
        raise IncompleteShardsError(
            f"shard directory {str(directory)!r} does not exist; write shards into it with "
            f"`stoker pack SRC {directory}`."
        )
    if not directory.is_dir():
        raise ShardError(f"`path` must be a shard directory. Found: {str(directory)!r}.")
    if not path.exists():
        if (directory / PACK_STATE_NAME).exists():
            raise IncompleteShardsError(
                f"{directory} holds an interrupted pack (no {INDEX_NAME}, a {PACK_STATE_NAME} "
                "left behind): its shards are incomplete. Finish it with "
                f"`stoker pack --resume SRC {directory}` (same SRC and options as before)."
            )
        tars = sorted(p.name for p in directory.glob("*.tar"))
        hint = (
            f"build one for its {len(tars)} tar files with `stoker index {directory}`"
            if tars
            else f"write shards into it with `stoker pack SRC {directory}`"
        )
        raise IncompleteShardsError(f"{directory} has no {INDEX_NAME}: {hint}.")
    try:
        obj = json.loads(path.read_text())
        if obj.get("format") != FORMAT or obj.get("version") != VERSION:
            raise ValueError(
                f"format {obj.get('format')!r} version {obj.get('version')!r}, expected "
                f"{FORMAT!r} version {VERSION}"
            )
        index = ShardIndex(
            shards=tuple(ShardInfo.from_json(s) for s in obj["shards"]),
            meta=dict(obj.get("meta", {})),
        )
        if index.samples != obj["samples"]:
            raise ValueError(f"'samples' says {obj['samples']}, the shards hold {index.samples}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ShardError(
            f"{path} is not a valid stoker shard index ({exc}); rebuild it with "
            f"`stoker index {directory}`."
        ) from exc
    return index


def build_index(
    directory: str | os.PathLike[str],
    *,
    shards: Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> ShardIndex:
    """Index the tar shards in a directory (written by stoker, WebDataset or any tar tool).

    Args:
        directory: the directory holding the ``.tar`` files.
        shards: file names to index, in order. Default ``None``: every ``*.tar`` file, sorted
            by name.
        meta: metadata stored in the index. Default: none.

    Returns:
        The :class:`ShardIndex`, also written to ``directory/index.json``.

    Raises:
        ShardError: if there are no tar files or one cannot be read.
    """
    directory = Path(directory)
    names = sorted(p.name for p in directory.glob("*.tar")) if shards is None else list(shards)
    if not names:
        raise ShardError(
            f"{directory} has no `.tar` files to index; write shards with "
            f"`stoker pack SRC {directory}`."
        )
    index = ShardIndex(tuple(describe_shard(directory / n) for n in names), dict(meta or {}))
    write_index(directory, index)
    return index
