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

An index is data from wherever the shards came from. :func:`read_index` checks every field
before anything uses it: integers are JSON integers (not booleans, floats or strings) within
their bounds, every member lies inside its shard's declared size (the reader checks that size
against the file when it maps it), names are plain file names, lists are lists. Anything else
is a :class:`ShardError` naming the file, the field and the value, so that no index can make a
read return bytes from outside its shard (an offset moved within the shard still reads that
shard's bytes: the index is the map), and nothing is allocated in proportion to a number the
file declares.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stoker.shards._errors import IncompleteShardsError, ShardError
from stoker.shards._files import read_regular, write_atomic
from stoker.shards._index_checks import check_depth, int_array, int_in, invalid, list_of, shown
from stoker.shards._tar import member_name_problem
from stoker.store import local_path

__all__ = [
    "CHUNK_SIZE",
    "FORMAT",
    "INDEX_NAME",
    "MAX_INDEX_BYTES",
    "MAX_META_DEPTH",
    "MAX_SHARD_BYTES",
    "PACK_STATE_NAME",
    "VERSION",
    "ShardIndex",
    "ShardInfo",
    "index_bytes",
    "load_index",
    "parse_index",
    "read_index",
    "shard_name_problem",
    "write_index",
]

FORMAT = "stoker.shards"
VERSION = 1
INDEX_NAME = "index.json"
PACK_STATE_NAME = ".stoker-pack.json"
CHUNK_SIZE = 1 << 16
READ_SIZE = 1 << 22
#: Largest ``index.json`` read. An index takes about 50 bytes per sample, so this holds some
#: five million; parsed, an index takes several times its size in memory.
MAX_INDEX_BYTES = 256 * 1024 * 1024
#: Largest shard size (and so member offset or size) an index may declare: an offset plus a
#: size then always fits in an int64.
MAX_SHARD_BYTES = 1 << 62
#: Deepest nesting of the free-form ``meta`` (deeper would break pickling to workers).
MAX_META_DEPTH = 32
_CRC_MAX = (1 << 32) - 1
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_SHARD_FIELDS = (
    "name",
    "size",
    "sha256",
    "samples",
    "keys",
    "fields",
    "pattern",
    "offsets",
    "sizes",
    "chunk_size",
    "chunk_crc32",
)


def shard_name_problem(name: object) -> str | None:
    """Why ``name`` may not be a shard's file name, or ``None`` when it may: it must be a
    non-empty string, not ``.`` or ``..``, without ``/``, ``\\`` or NUL."""
    if type(name) is not str or not name:
        return "must be a non-empty string"
    if name in (".", "..") or any(c in name for c in "/\\\0"):
        return "must be a file name in the shard folder (not '.' or '..', no '/', '\\' or NUL)"
    return None


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
            raise ShardError(f"{self.name}: {len(self.keys)} keys but {len(self.pattern)} patterns")
        lengths = np.array([len(f) for f in self.fields], dtype=np.int64)
        counts = lengths[self.pattern] if len(self.pattern) else np.zeros(0, np.int64)
        starts = np.zeros(len(self.keys) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        if starts[-1] != len(self.offsets) or len(self.offsets) != len(self.sizes):
            raise ShardError(
                f"{self.name}: the samples' fields name {int(starts[-1])} members but there are "
                f"{len(self.offsets)} offsets and {len(self.sizes)} sizes"
            )
        if len(self.offsets) and int((self.offsets + self.sizes).max()) > self.size:
            raise ShardError(f"{self.name}: a member ends past the shard's size {self.size}")
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
    def from_json(cls, obj: object, where: str = "shard") -> ShardInfo:
        """Build a shard's description from its index entry, checking every field.

        Args:
            obj: the parsed JSON entry.
            where: names the entry in messages (``"shards[3]"``).

        Raises:
            ShardError: naming the first field that is missing, of the wrong type, out of
                bounds or inconsistent with the others, and its value.
        """
        if type(obj) is not dict:
            raise invalid(where, obj, "must be a JSON object")
        missing = [k for k in _SHARD_FIELDS if k not in obj]
        if missing:
            raise ShardError(f"`{where}.{missing[0]}` is missing.")
        problem = shard_name_problem(obj["name"])
        if problem is not None:
            raise invalid(f"{where}.name", obj["name"], problem)
        size = int_in(obj["size"], f"{where}.size", 0, MAX_SHARD_BYTES)
        sha256 = obj["sha256"]
        if type(sha256) is not str or not _SHA256_RE.fullmatch(sha256):
            raise invalid(f"{where}.sha256", sha256, "must be 64 lower-case hex digits")
        keys = list_of(obj["keys"], f"{where}.keys", str)
        for i, key in enumerate(keys):  # keys reach the user as `__key__`, often a file name
            problem = member_name_problem(key)
            if problem is not None:
                raise invalid(
                    f"{where}.keys[{i}]",
                    key,
                    f"must be relative, without '..' or NUL (it {problem})",
                )
        n = len(keys)
        int_in(obj["samples"], f"{where}.samples", n, n, f"must be the number of keys, {n}")
        fields = list_of(obj["fields"], f"{where}.fields", list)
        for i, exts in enumerate(fields):
            list_of(exts, f"{where}.fields[{i}]", str)
            if not exts or len(set(exts)) != len(exts):
                raise invalid(f"{where}.fields[{i}]", exts, "must list distinct extensions")
        if keys and not fields:
            raise invalid(f"{where}.fields", fields, "must list the samples' extensions")
        pattern = int_array(obj["pattern"], f"{where}.pattern", 0, len(fields) - 1)
        if len(pattern) != len(keys):
            raise invalid(f"{where}.pattern", obj["pattern"], f"must have {len(keys)} entries")
        members = int(np.array([len(e) for e in fields], dtype=np.int64)[pattern].sum())
        offsets = int_array(obj["offsets"], f"{where}.offsets", 0, size)
        sizes = int_array(obj["sizes"], f"{where}.sizes", 0, size)
        for name, array in (("offsets", offsets), ("sizes", sizes)):
            if len(array) != members:
                raise invalid(
                    f"{where}.{name}", obj[name], f"must have {members} entries (one per member)"
                )
        past = offsets + sizes > size  # no overflow: both are at most MAX_SHARD_BYTES
        if past.any():
            j = int(past.argmax())
            raise invalid(
                f"{where}.offsets[{j}] + {where}.sizes[{j}]",
                int(offsets[j]) + int(sizes[j]),
                f"must be at most the shard's size {size}",
            )
        chunk_size = int_in(obj["chunk_size"], f"{where}.chunk_size", 1, MAX_SHARD_BYTES)
        crcs = int_array(obj["chunk_crc32"], f"{where}.chunk_crc32", 0, _CRC_MAX)
        chunks = -(-size // chunk_size)
        if len(crcs) != chunks:
            raise invalid(f"{where}.chunk_crc32", obj["chunk_crc32"], f"must have {chunks} entries")
        return cls(
            name=obj["name"],
            size=size,
            sha256=sha256,
            keys=tuple(keys),
            fields=tuple(tuple(e) for e in fields),
            pattern=pattern,
            offsets=offsets,
            sizes=sizes,
            chunk_size=chunk_size,
            chunk_crc32=tuple(crcs.tolist()),
        )


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


def write_index(directory: str | os.PathLike[str], index: ShardIndex) -> Path:
    """Write ``index.json`` atomically (deterministic bytes for the same index).

    Returns:
        The index path.
    """
    path = Path(directory) / INDEX_NAME
    write_atomic(path, index_bytes(index))
    return path


def index_bytes(index: ShardIndex) -> bytes:
    """The bytes of ``index.json`` for ``index`` (sorted keys, no timestamps)."""
    return json.dumps(index.to_json(), sort_keys=True, separators=(",", ":")).encode() + b"\n"


def parse_index(obj: object) -> ShardIndex:
    """Build a :class:`ShardIndex` from parsed ``index.json``, checking every field.

    Raises:
        ShardError: naming the first field that is missing, of the wrong type, out of bounds
            or inconsistent with the others, and its value.
    """
    if type(obj) is not dict:
        raise invalid("(top level)", obj, "must be a JSON object")
    fmt, version = obj.get("format"), obj.get("version")
    if fmt != FORMAT or type(version) is not int or version != VERSION:
        raise ShardError(
            f"`format` and `version` must be {FORMAT!r} and {VERSION}. Found: "
            f"{shown(fmt)} and {shown(version)}."
        )
    shards = list_of(obj.get("shards"), "shards", dict)
    meta = obj.get("meta", {})
    if type(meta) is not dict:
        raise invalid("meta", meta, "must be a JSON object")
    check_depth(meta, "meta", MAX_META_DEPTH)
    index = ShardIndex(
        shards=tuple(ShardInfo.from_json(s, f"shards[{i}]") for i, s in enumerate(shards)),
        meta=meta,
    )
    total = index.samples
    int_in(obj.get("samples"), "samples", total, total, f"must be the shards' {total} samples")
    return index


def read_index(directory: str | os.PathLike[str]) -> ShardIndex:
    """Read and validate a directory's ``index.json`` (see the module docstring).

    Args:
        directory: the shard directory.

    Returns:
        The :class:`ShardIndex`.

    Raises:
        IncompleteShardsError: if there is no index (naming `stoker pack --resume` when an
            interrupted pack is found, `stoker index` when foreign tar files are).
        ShardError: if the index is not a regular file of at most :data:`MAX_INDEX_BYTES`,
            cannot be parsed, or fails a check (the message names the field and its value).
    """
    directory = local_path(directory, "`directory` (for a store URL use ShardDataset)")
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
    fix = f"Rebuild it with `stoker index {directory}`, or re-pack the shards."
    try:
        data = read_regular(path, MAX_INDEX_BYTES, "shard index")
    except OSError as exc:
        raise ShardError(f"{path} cannot be read ({exc.strerror or exc}).") from exc
    except ShardError as exc:
        raise ShardError(f"{exc} {fix}") from exc
    return load_index(data, str(path), fix)


def load_index(data: bytes, where: str, fix: str) -> ShardIndex:
    """Parse and validate the bytes of an ``index.json`` read from ``where`` (a path or URL).

    Raises:
        ShardError: naming ``where``, the problem and ``fix``.
    """
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError too
        raise ShardError(f"{where} is not a stoker shard index: not JSON ({exc}). {fix}") from exc
    try:
        return parse_index(obj)
    except ShardError as exc:
        raise ShardError(f"{where} is not a valid stoker shard index: {exc} {fix}") from exc
