"""File access that a folder other users can write to cannot hang, redirect or lead outside.

Reading: a file is opened non-blocking and used only if ``fstat`` says it is a regular file (a
FIFO planted under a shard's or an index's name would block ``open`` forever, a device would
read without end). A pack source is listed by :class:`SourceTree`: regular files only,
symbolic links followed only on request and only to targets inside the source, each folder
once (a loop ``a -> .`` ends); its files are then opened one path component at a time with
``O_NOFOLLOW``, so a link swapped in after the listing cannot lead out of the source.

Writing: every file is written under a fresh name from :func:`tempfile.mkstemp` (``O_EXCL``,
mode 0600, so a link planted at a predictable name is never followed), fsync'ed, given the
permissions ``open`` would have given it (``0o666`` less the umask: shards and indexes are
meant to be shared as the user's umask shares any file) and renamed into place, which
replaces a planted link rather than writing through it. A directory that other users can
write to, that is not the user's and not sticky, is refused: its other writers could replace
what stoker writes there.
"""

from __future__ import annotations

import collections
import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from stoker.shards._errors import ShardArgumentError, ShardError

__all__ = [
    "SourceTree",
    "check_output_dir",
    "file_kind",
    "fsync_dir",
    "open_beneath",
    "open_regular",
    "publish",
    "read_regular",
    "shared_mode",
    "temp_file",
    "write_atomic",
]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
_READ_FLAGS = os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC | _O_BINARY
# Component-wise opening needs openat(2) semantics; elsewhere (Windows) paths are joined.
_OPENAT = _O_NOFOLLOW != 0 and _O_DIRECTORY != 0 and os.open in os.supports_dir_fd


def file_kind(mode: int) -> str:
    """What ``st_mode`` describes, for a message: ``"a FIFO"``, ``"a folder"``..."""
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), f"a file of mode 0o{mode:o}")


def _require_regular(fd: int, what: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ShardError(f"{what} is {file_kind(st.st_mode)}, not a regular file: remove it.")
    return st


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open a regular file for reading without blocking (symbolic links are followed).

    Returns:
        The file descriptor (the caller closes it) and its ``fstat``.

    Raises:
        ShardError: if ``path`` is a FIFO, socket, device or folder.
        OSError: if it cannot be opened.
    """
    fd = os.open(path, _READ_FLAGS)
    return fd, _require_regular(fd, str(path))


def read_regular(path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Raises:
        ShardError: if it is not a regular file or is larger than ``limit``.
        OSError: if it cannot be read.
    """
    fd, st = open_regular(path)
    with open(fd, "rb") as f:
        if st.st_size > limit:
            raise ShardError(
                f"{what} {str(path)!r} is {st.st_size} bytes, over the limit of {limit}: it is "
                "not a file stoker wrote."
            )
        data = f.read(st.st_size + 1)  # read(n) allocates n bytes first: not the limit
    if len(data) != st.st_size:
        raise ShardError(
            f"{what} {str(path)!r} changed size as it was read (from {st.st_size} bytes): "
            "something is writing it; try again once it is complete."
        )
    return data


def open_beneath(root: str, rel: str) -> BinaryIO:
    """Open ``root/rel`` for reading, refusing a symbolic link in any component of ``rel``.

    Args:
        root: a folder (links in it are the caller's choice, e.g. the pack source given).
        rel: a ``/``-separated path relative to ``root``, without links (as a walk found it).

    Returns:
        The open file.

    Raises:
        ShardError: if a component became a link, or the file is not a regular file.
    """
    full = os.path.join(root, *rel.split("/"))
    try:
        if not _OPENAT:
            if os.path.islink(full):
                raise OSError(f"{full} is a symbolic link")
            fd = os.open(full, _READ_FLAGS)
        else:
            fd = _open_at(root, rel.split("/"))
    except OSError as exc:
        raise ShardError(
            f"{full} cannot be read as a regular file inside {root} ({exc}): it changed since "
            "the source was listed (a symbolic link put in its way?)."
        ) from exc
    _require_regular(fd, full)
    return open(fd, "rb")


def _open_at(root: str, parts: list[str]) -> int:
    dir_fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        for part in parts[:-1]:
            next_fd = os.open(
                part, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd
            )
            os.close(dir_fd)
            dir_fd = next_fd
        return os.open(parts[-1], _READ_FLAGS | _O_NOFOLLOW, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def check_output_dir(directory: Path) -> None:
    """Refuse a folder that other users may write to, unless it is the user's own or sticky.

    Raises:
        ShardArgumentError: naming the folder, its mode and owner, and the fix; or if it does
            not exist.
    """
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        raise ShardArgumentError(
            f"folder {str(directory)!r} does not exist: create it first."
        ) from None
    shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    euid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if shared and st.st_uid != euid and not st.st_mode & stat.S_ISVTX:
        raise ShardArgumentError(
            f"folder {str(directory)!r} may be written by other users (mode "
            f"0o{stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}, not yours, not sticky): "
            "they could replace the shards or the index stoker writes there. Write into a "
            f"folder you own, or have its owner run `chmod go-w {directory}`."
        )


def _umask() -> int:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)  # no /proc: read it by setting it (briefly) and back
    os.umask(mask)
    return mask


def shared_mode() -> int:
    """The mode ``open`` gives a new file: ``0o666`` less the process umask."""
    return 0o666 & ~_umask()


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that a rename in it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def temp_file(final: Path) -> Iterator[tuple[BinaryIO, Path]]:
    """A new private file next to ``final`` (``.{name}.XXXXXXXX.tmp``), removed on error.

    The caller writes it and passes it to :func:`publish`; the name cannot be predicted, so a
    link planted in the folder is never written through.
    """
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    path = Path(tmp)
    f = open(fd, "wb")
    try:
        yield f, path
    except BaseException:
        f.close()
        path.unlink(missing_ok=True)
        raise
    f.close()


def publish(f: BinaryIO, tmp: Path, final: Path) -> None:
    """Flush, fsync, share (:func:`shared_mode`) and rename ``tmp`` to ``final``, durably."""
    f.flush()
    os.fsync(f.fileno())
    if hasattr(os, "fchmod"):
        os.fchmod(f.fileno(), shared_mode())
    f.close()
    os.replace(tmp, final)
    fsync_dir(final.parent)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a private temporary file, fsync and rename."""
    with temp_file(path) as (f, tmp):
        f.write(data)
        publish(f, tmp, path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class SourceTree:
    """The regular files under a pack source folder, in ``os.walk``'s order (a folder's files
    by name, then its sub-folders by name), as paths that never leave the folder.

    Symbolic links are skipped, or with ``follow_links`` followed when their target lies inside
    the folder; every folder is walked at most once (by device and inode), so a loop such as
    ``a -> .`` ends, and real folders are walked before links to folders. FIFOs, sockets and
    devices are skipped (reading one would block or never end). Skipped entries are recorded
    in :attr:`skipped`.

    Args:
        root: the source folder; a link given here is followed (the caller named it).
        follow_links: follow links to targets inside ``root``. Default ``False``.

    Attributes:
        root: the real path of the folder.
        skipped: ``(path relative to root, why)`` of each entry left out.
    """

    def __init__(self, root: str | os.PathLike[str], *, follow_links: bool = False) -> None:
        self.root = os.path.realpath(root)
        self.follow_links = follow_links
        self.skipped: list[tuple[str, str]] = []
        st = os.stat(self.root)
        self._visited = {(st.st_dev, st.st_ino)}

    def files(
        self,
        tops: Sequence[str] = ("",),
        *,
        want: Callable[[str], bool],
        hidden_folders: bool = True,
    ) -> list[list[tuple[str, str]]]:
        """The files under each of ``tops`` whose name ``want`` accepts.

        Real folders are walked first, all of them; links to folders (with ``follow_links``)
        only after, so a folder reached both directly and through a link is listed under its
        own path, with its own top.

        Args:
            tops: folder names directly under ``root`` (``""``: ``root`` itself). Default:
                ``root``.
            want: takes a file name; entries it refuses are neither listed nor recorded.
            hidden_folders: walk into folders whose name starts with a dot. Default ``True``.

        Returns:
            Per top, ``(path as walked, path of the file itself)``, both ``/``-separated and
            relative to :attr:`root`; the second is what :meth:`open` takes (they differ below
            a followed link).
        """
        found: list[list[tuple[str, str]]] = [[] for _ in tops]
        links: collections.deque[tuple[int, str, str]] = collections.deque()

        def walk(number: int, start: tuple[str, str]) -> None:
            stack = [start]
            while stack:
                walked, real = stack.pop()
                try:
                    with os.scandir(self._path(real)) as it:
                        entries = sorted(it, key=lambda e: e.name)
                except OSError as exc:
                    self.skipped.append((walked or ".", f"cannot be listed ({exc.strerror})"))
                    continue
                folders: list[tuple[str, str]] = []
                for entry in entries:
                    name = entry.name
                    w = f"{walked}/{name}" if walked else name
                    r = f"{real}/{name}" if real else name
                    folder_wanted = hidden_folders or not name.startswith(".")
                    if entry.is_file(follow_symlinks=False):
                        if want(name):
                            found[number].append((w, r))
                    elif entry.is_dir(follow_symlinks=False):
                        if folder_wanted and (target := self._enter(w, entry.path)) is not None:
                            folders.append(target)
                    elif entry.is_symlink() and folder_wanted and entry.is_dir():
                        links.append((number, w, entry.path))
                    elif want(name) and (target := self._enter(w, entry.path, file=True)):
                        found[number].append(target)
                stack += reversed(folders)

        for number, top in enumerate(tops):
            path = os.path.join(self.root, top)
            if top and os.path.islink(path):
                links.append((number, top, path))
            elif (start := ("", "") if not top else self._enter(top, path)) is not None:
                walk(number, start)
        while links:
            number, walked, path = links.popleft()
            if (start := self._enter(walked, path)) is not None:
                walk(number, start)
        return found

    def _path(self, real: str) -> str:
        return os.path.join(self.root, *real.split("/")) if real else self.root

    def _enter(self, walked: str, path: str, *, file: bool = False) -> tuple[str, str] | None:
        """``(walked, real)`` of a folder (or, with ``file``, a regular file) at ``path``, or
        ``None`` after recording why it is skipped."""
        try:
            st = os.lstat(path)
        except OSError as exc:
            self.skipped.append((walked, f"cannot be read ({exc.strerror or exc})"))
            return None
        real = walked
        if stat.S_ISLNK(st.st_mode):
            if not self.follow_links:
                self.skipped.append(
                    (walked, "a symbolic link (`follow_links=True`, `--follow-links`: follow it)")
                )
                return None
            target = os.path.realpath(path)
            if not _inside(target, self.root):
                self.skipped.append((walked, f"a symbolic link to {target!r}, outside the source"))
                return None
            try:
                st = os.stat(target)
            except OSError:
                self.skipped.append((walked, "a broken symbolic link"))
                return None
            rel = os.path.relpath(target, self.root)
            real = "" if rel == os.curdir else rel.replace(os.sep, "/")
        if stat.S_ISDIR(st.st_mode) and not file:
            if (st.st_dev, st.st_ino) in self._visited:
                self.skipped.append((walked, "a folder already walked (a link loop?)"))
                return None
            self._visited.add((st.st_dev, st.st_ino))
            return walked, real
        if stat.S_ISREG(st.st_mode) and file:
            return walked, real
        self.skipped.append((walked, file_kind(st.st_mode)))
        return None

    def open(self, real: str) -> BinaryIO:
        """Open a file :meth:`files` listed (its second path), with no link on the way.

        Raises:
            ShardError: if the file became a link or stopped being a regular file.
        """
        return open_beneath(self.root, real)
