"""POSIX tar members written and read at exact byte offsets.

Members are written with deterministic headers (fixed mtime, uid/gid 0, empty user and group
names, mode 0o644) so that the same samples always give the same bytes. Names follow
WebDataset's convention: ``{key}.{ext}``, where the key is everything up to the first dot of
the file name and the extension everything after it.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass

__all__ = [
    "BLOCK",
    "EncodedSample",
    "TarEntry",
    "encode_sample",
    "end_of_archive",
    "scan_tar",
    "split_name",
]

BLOCK = 512
RECORD = 20 * BLOCK
MTIME = 0
MODE = 0o644

# WebDataset's `base_plus_ext`: key = path up to the first dot of the basename.
_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def split_name(name: str) -> tuple[str, str] | None:
    """Split a member name into (key, extension) as WebDataset does.

    Args:
        name: a tar member name such as ``"a/b/000001.seg.png"``.

    Returns:
        ``(key, ext)`` with the extension lower-cased (``("a/b/000001", "seg.png")``), or
        ``None`` when the name has no extension (WebDataset skips such members).
    """
    match = _NAME_RE.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = MTIME
    info.mode = MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


@dataclass(frozen=True)
class EncodedSample:
    """One sample as tar bytes, ready to be appended to a shard.

    Attributes:
        key: the sample key.
        blob: headers, data and padding of every member, in member order.
        members: ``(ext, data offset within blob, size)`` per member.
    """

    key: str
    blob: bytes
    members: tuple[tuple[str, int, int], ...]


def encode_sample(key: str, fields: list[tuple[str, bytes]]) -> EncodedSample:
    """Encode one sample's members as contiguous tar bytes.

    Args:
        key: sample key; must not contain a dot after its last ``/``.
        fields: ``(ext, data)`` pairs, written in the given order.

    Returns:
        The :class:`EncodedSample`.

    Raises:
        ValueError: if the key or an extension would not split back as WebDataset splits it.
    """
    parts: list[bytes] = []
    members: list[tuple[str, int, int]] = []
    pos = 0
    for ext, data in fields:
        name = f"{key}.{ext}"
        if split_name(name) != (key, ext.lower()) or not ext:
            raise ValueError(
                f"member name {name!r} does not split into key {key!r} and extension {ext!r}: "
                "keys may not contain a dot in their last path component."
            )
        header = _header(name, len(data))
        parts += [header, data, b"\0" * (-len(data) % BLOCK)]
        members.append((ext, pos + len(header), len(data)))
        pos += len(header) + len(data) + (-len(data) % BLOCK)
    return EncodedSample(key, b"".join(parts), tuple(members))


def end_of_archive(offset: int) -> bytes:
    """The two zero blocks that end an archive, padded to a whole tar record.

    Args:
        offset: the archive's size before the end blocks (a multiple of 512).

    Returns:
        The trailing zero bytes.
    """
    end = offset + 2 * BLOCK
    return b"\0" * (end - offset + (-end % RECORD))


@dataclass(frozen=True)
class TarEntry:
    """A regular file inside a tar archive.

    Attributes:
        name: member name.
        offset: byte offset of the member's first header block (pax headers included).
        data_offset: byte offset of its data.
        size: data size in bytes.
    """

    name: str
    offset: int
    data_offset: int
    size: int


def scan_tar(path: str) -> list[TarEntry]:
    """List the regular files of an uncompressed tar archive with their byte offsets.

    Args:
        path: the archive.

    Returns:
        One :class:`TarEntry` per regular file, in archive order.

    Raises:
        tarfile.TarError: if the file is not a readable uncompressed tar archive.
    """
    entries = []
    with tarfile.open(path, mode="r:", errorlevel=2) as tar:
        for info in tar:
            if info.isreg():
                entries.append(TarEntry(info.name, info.offset, info.offset_data, info.size))
    return entries
