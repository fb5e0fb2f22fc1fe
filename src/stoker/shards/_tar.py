"""POSIX tar members written and read at exact byte offsets.

Members are written with deterministic headers (fixed mtime, uid/gid 0, empty user and group
names, mode 0o644) so that the same samples always give the same bytes. Names follow
WebDataset's convention: ``{key}.{ext}``, where the key is everything up to the first dot of
the file name and the extension everything after it.

Archives from elsewhere are read as data, not trusted: only regular members are indexed (a
sparse member's bytes are not where its size says, a link has none), and a name that is
absolute, has a ``..`` component or a NUL is refused, in what is read and in what is written.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass
from typing import BinaryIO

from stoker.shards._errors import ShardError

__all__ = [
    "BLOCK",
    "EncodedSample",
    "TarEntry",
    "check_member_name",
    "encode_sample",
    "end_of_archive",
    "member_name_problem",
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


def member_name_problem(name: str) -> str | None:
    """Why ``name`` may not be a member name, or ``None`` when it may.

    Refused: an empty name, a NUL character (C tools cut the name there), an absolute name
    (``/`` or ``\\`` first, or a drive letter) and a ``..`` component (with ``/`` or ``\\``
    as separator): extracted, such a member would land outside the folder it is unpacked to.
    """
    if not name:
        return "is empty"
    if "\0" in name:
        return "contains a NUL character (tools that read it cut the name there)"
    outside = "extracted, it would land outside the folder it is unpacked to"
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
        return f"is absolute ({outside})"
    if ".." in name.replace("\\", "/").split("/"):
        return f"has a '..' component ({outside})"
    return None


def check_member_name(name: str) -> str:
    """Return ``name`` if it may be a tar member name (see :func:`member_name_problem`).

    Raises:
        ShardError: naming the name and why it is refused.
    """
    problem = member_name_problem(name)
    if problem is not None:
        raise ShardError(
            f"member name {name!r} {problem}: use keys that are relative paths without '..' or NUL."
        )
    return name


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
        ValueError: if the key or an extension would not split back as WebDataset splits it,
            or the name is refused by :func:`member_name_problem`.
    """
    parts: list[bytes] = []
    members: list[tuple[str, int, int]] = []
    pos = 0
    for ext, data in fields:
        name = f"{key}.{ext}"
        problem = member_name_problem(name)
        if problem is not None:
            raise ValueError(
                f"member name {name!r} {problem}: use keys that are relative paths without '..' "
                "or NUL."
            )
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


class _Clamped:
    """A file object whose reads stop at ``size``: tarfile reads a pax or GNU long-name
    header's declared size at once, and ``read(n)`` allocates ``n`` bytes before reading."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self._size = size

    def read(self, n: int | None = -1) -> bytes:
        left = max(0, self._size - self._f.tell())
        return self._f.read(left if n is None or n < 0 else min(n, left))

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()


# What tarfile raises, besides TarError, on malformed headers (an IndexError on a truncated
# sparse map, a RecursionError on a chain of GNU long-name headers, an OverflowError on a
# base-256 size past 2**63, a ValueError on a bad number).
_PARSE_ERRORS = (
    tarfile.TarError,
    EOFError,
    IndexError,
    OverflowError,
    RecursionError,
    UnicodeError,
    ValueError,
)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}


def scan_tar(f: BinaryIO, size: int, where: str) -> list[TarEntry]:
    """List the regular files of an uncompressed tar archive with their byte offsets.

    Folder entries are skipped (they hold no bytes; ``tar`` writes one for every folder it
    archives).

    Args:
        f: the archive, open for reading at offset 0.
        size: its size in bytes; nothing past it is read.
        where: names the archive in messages.

    Returns:
        One :class:`TarEntry` per regular file, in archive order.

    Raises:
        ShardError: if the file is not a readable uncompressed tar archive, or holds a member
            that is not a regular file or a folder (a link, device, FIFO, sparse file), or
            whose name :func:`member_name_problem` refuses, or whose data runs past the end.
    """
    entries: list[TarEntry] = []
    try:
        with tarfile.open(fileobj=_Clamped(f, size), mode="r:", errorlevel=2) as tar:  # type: ignore[call-overload]
            for info in tar:
                if entries:
                    _check_overlap(entries[-1], info.offset, where)
                if info.isdir():
                    continue
                _check_member(info, size, where)
                entries.append(TarEntry(info.name, info.offset, info.offset_data, info.size))
    except _PARSE_ERRORS as exc:
        raise ShardError(
            f"{where} is not a readable uncompressed tar archive ({type(exc).__name__}: "
            f"{exc}): shards must be plain `.tar` files (decompress `.tar.gz` first)."
        ) from exc
    return entries


def _check_overlap(entry: TarEntry, next_offset: int, where: str) -> None:
    """A member's data must end before the next member's header: tarfile finds the next header
    from the ustar size field, but reports a size a pax header (``size``, or
    ``GNU.sparse.realsize`` alone) may have changed, so reading that size would return the
    next members' bytes."""
    if entry.data_offset + entry.size > next_offset:
        raise ShardError(
            f"{where}: member {entry.name!r} (header at byte offset {entry.offset}) declares "
            f"{entry.size} bytes of data from byte offset {entry.data_offset}, but the next "
            f"member starts at byte offset {next_offset}: a pax header changed its size. "
            "Re-create the archive from regular files (no `--sparse`, no pax size records)."
        )


def _check_member(info: tarfile.TarInfo, size: int, where: str) -> None:
    at = f"{where}: member {info.name!r} (header at byte offset {info.offset})"
    if info.sparse is not None or info.type not in _REGULAR:
        kind = "a sparse file" if info.sparse is not None else _KINDS.get(info.type)
        kind = kind or f"of unknown type {info.type!r}"
        raise ShardError(
            f"{at} is {kind}, not a regular file: shards are read by byte offset and hold only "
            "regular files. Re-create the archive from regular files (`tar --hard-dereference "
            "--dereference`, no `--sparse`)."
        )
    problem = member_name_problem(info.name)
    if problem is not None:
        raise ShardError(
            f"{at}: its name {problem}. Re-create the archive with relative names without "
            "'..' or NUL."
        )
    if info.offset_data + info.size > size:
        raise ShardError(
            f"{at} has {info.size} bytes of data from byte offset {info.offset_data}, past the "
            f"end of the {size}-byte file: the archive is truncated."
        )
