"""Describing tar shards as index entries: one pass over each file for its members, its sha256
and the CRC-32 of each chunk, and the ``index.json`` of a folder of shards."""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from stoker.shards._errors import ShardArgumentError, ShardError
from stoker.shards._files import check_output_dir, open_regular
from stoker.shards._index import (
    CHUNK_SIZE,
    READ_SIZE,
    ShardIndex,
    ShardInfo,
    shard_name_problem,
    write_index,
)
from stoker.shards._tar import scan_tar, split_name
from stoker.store import local_path

__all__ = ["build_index", "describe_shard", "file_checksums"]


def file_checksums(f: BinaryIO, size: int, chunk_size: int = CHUNK_SIZE) -> tuple[str, list[int]]:
    """sha256 of the first ``size`` bytes of ``f`` and the CRC-32 of each ``chunk_size`` chunk
    of them, in one pass from the current position."""
    digest = hashlib.sha256()
    crcs: list[int] = []
    read = max(chunk_size, READ_SIZE // chunk_size * chunk_size)
    left = size
    while left > 0 and (block := f.read(min(read, left))):
        left -= len(block)
        digest.update(block)
        view = memoryview(block)
        crcs += [zlib.crc32(view[i : i + chunk_size]) for i in range(0, len(view), chunk_size)]
    return digest.hexdigest(), crcs


def describe_shard(path: str | os.PathLike[str]) -> ShardInfo:
    """Scan one tar file and describe it as an index entry.

    Members are grouped into samples as WebDataset groups them (consecutive members with the
    same key); members without an extension, and folder entries, are skipped.

    Args:
        path: the tar file.

    Returns:
        The :class:`ShardInfo`.

    Raises:
        ShardError: if the file is not a regular file or not a readable uncompressed tar, if
            it holds a member that is not a regular file (a link, device, FIFO, sparse file)
            or has an absolute name or a ``..`` component, or a key repeats an extension.
    """
    path = Path(path)
    try:
        fd, st = open_regular(path)
    except OSError as exc:
        raise ShardError(f"{path} cannot be read ({exc.strerror or exc}).") from exc
    with open(fd, "rb") as f:
        try:
            entries = scan_tar(f, st.st_size, str(path))
            f.seek(0)
            sha, crcs = file_checksums(f, st.st_size)
        except OSError as exc:
            raise ShardError(f"{path} cannot be read ({exc.strerror or exc}).") from exc
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
    return ShardInfo(
        name=path.name,
        size=st.st_size,
        sha256=sha,
        keys=tuple(keys),
        fields=tuple(table),
        pattern=np.asarray(pattern, dtype=np.int64),
        offsets=np.asarray(offsets, dtype=np.int64),
        sizes=np.asarray(sizes, dtype=np.int64),
        chunk_size=CHUNK_SIZE,
        chunk_crc32=tuple(crcs),
    )


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
        ShardArgumentError: if the directory does not exist, is not a directory, has no tar
            files, is writable by other users (see :func:`check_output_dir`), or a name in
            ``shards`` is not a plain file name.
        ShardError: if a tar file cannot be read or indexed.
    """
    directory = local_path(directory, "`directory` (for a store URL use `stoker index URL`)")
    fix = "pass the folder that holds the `.tar` shards"
    if not directory.exists():
        raise ShardArgumentError(f"{str(directory)!r} does not exist: {fix}.")
    if not directory.is_dir():
        raise ShardArgumentError(f"{str(directory)!r} is not a folder: {fix}.")
    names = sorted(p.name for p in directory.glob("*.tar")) if shards is None else list(shards)
    for name in names:
        problem = shard_name_problem(name)
        if problem is not None:
            raise ShardArgumentError(f"`shards` entry {name!r} {problem}.")
    if not names:
        raise ShardArgumentError(
            f"{directory} has no `.tar` files to index; write shards with "
            f"`stoker pack SRC {directory}`."
        )
    check_output_dir(directory)
    index = ShardIndex(tuple(describe_shard(directory / n) for n in names), dict(meta or {}))
    write_index(directory, index)
    return index
