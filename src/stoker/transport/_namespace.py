"""A worker pool's private directory in the shared-memory directory, and reclaiming stale ones.

The shared-memory directory (/dev/shm) is shared with other users and other containers, so a
pool never creates a file there directly: it makes a directory of its own with ``mkdtemp``
(mode 0700, a random name: no one else can enter it, plant a file in it or guess it), and
creates every file inside it with ``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600.

A pool directory is named ``stoker-<pid>-<8 random characters>`` and holds a marker file;
liveness is an ``flock`` held on the directory for the pool's whole life, not a pid: the lock
lives on the tmpfs inode, so it is seen across pid namespaces (containers sharing /dev/shm with
``--ipc=host`` have small, equal pids). A pool whose lock can be taken belongs to no live
process (forked workers inherit the lock, so a pool is live while any of them runs), and
:func:`reclaim_stale_pools` removes it. Reclaim is best effort: it looks only at directories
owned by this user, never follows a link, and counts every error instead of raising.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import tempfile
from dataclasses import dataclass

__all__ = [
    "POOL_PREFIX",
    "PoolNamespace",
    "ReclaimReport",
    "create_private_file",
    "open_private_file",
    "reclaim_stale_pools",
]

POOL_PREFIX = "stoker-"
# A pool directory's name: the prefix, the creator's pid, mkdtemp's 8 random characters.
_POOL_NAME = re.compile(r"stoker-[0-9]+-[a-z0-9_]{8}")
# A file every pool directory holds: a directory without it (a user's own ``stoker-...``
# folder) is never reclaimed.
MARKER = ".stoker-pool"
# Tries at creating a pool directory that a concurrent reclaim removed before it was locked.
CREATE_TRIES = 8
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_private_file(path: str, flags: int = os.O_RDWR) -> int:
    """Create ``path`` for this user only (mode 0600); fails if anything is already there.

    ``O_EXCL`` refuses an existing file, ``O_NOFOLLOW`` a planted symlink, so a name another
    user chose in advance can never redirect the write.

    Returns:
        The open file descriptor (close-on-exec).
    """
    return os.open(path, flags | _NEW_FILE_FLAGS, 0o600)


def open_private_file(path: str, flags: int = os.O_RDONLY) -> int:
    """Open an existing file stoker made, refusing a symlink and anything not a regular file.

    ``O_NONBLOCK`` keeps a FIFO planted at the name from blocking the open; the check after it
    refuses the FIFO.

    Raises:
        OSError: the file is missing, a symlink (``ELOOP``) or not a regular file.
    """
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"{path} is not a regular file of this user")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class PoolNamespace:
    """A private, locked directory holding one worker pool's shared-memory files.

    Use :meth:`create`; :meth:`close` removes the directory and everything in it.

    Attributes:
        path: the directory (``<parent>/stoker-<pid>-<random>``).
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd  # the directory, open and flock'ed for the pool's life

    @classmethod
    def create(cls, parent: str) -> PoolNamespace:
        """Make and lock a new pool directory in ``parent``.

        Raises:
            OSError: the directory cannot be made (missing, not writable, full).
        """
        for _ in range(CREATE_TRIES):
            path = tempfile.mkdtemp(prefix=f"{POOL_PREFIX}{os.getpid()}-", dir=parent)
            try:
                fd = os.open(path, _DIR_FLAGS)
            except FileNotFoundError:  # a reclaim took it in the instant before the lock
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.close(create_private_file(os.path.join(path, MARKER)))
                    return cls(path, fd)
            except OSError:
                pass
            os.close(fd)
        raise OSError(f"could not create a private pool directory in {parent}")

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def file(self, name: str) -> str:
        """The path of file ``name`` in this pool's directory."""
        return os.path.join(self.path, name)

    def close(self) -> None:
        """Remove every file in the directory, the directory, and give up the lock."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            _empty(fd)
            with contextlib.suppress(OSError):
                os.rmdir(self.path)
        finally:
            os.close(fd)


def _empty(dir_fd: int) -> int:
    """Unlink every entry of the directory open as ``dir_fd`` (links themselves, never their
    targets); returns the errors met."""
    errors = 0
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return 1
    for name in names:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError:
            errors += 1
    return errors


@dataclass
class ReclaimReport:
    """What :func:`reclaim_stale_pools` did with the entries named like a pool."""

    removed: int = 0  # stale pools of this user, removed
    live: int = 0  # pools whose lock is held: left alone
    foreign: int = 0  # not a directory of this user (another user's, a file, a link): left alone
    errors: int = 0  # entries that could not be examined or removed (never raised)


def reclaim_stale_pools(parent: str) -> ReclaimReport:
    """Remove this user's pool directories in ``parent`` that no live process holds.

    Never raises: every entry it cannot judge or remove is left alone and counted.
    """
    report = ReclaimReport()
    try:
        names = os.listdir(parent)
    except OSError:
        report.errors += 1
        return report
    uid = os.geteuid()
    for name in names:
        if _POOL_NAME.fullmatch(name):
            _reclaim_one(os.path.join(parent, name), uid, report)
    return report


def _reclaim_one(path: str, uid: int, report: ReclaimReport) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        report.errors += 1
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        report.foreign += 1
        return
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        report.errors += 1
        return
    try:
        if os.fstat(fd).st_ino != st.st_ino:  # replaced since the lstat: judge it next time
            report.errors += 1
            return
        try:
            marker = os.stat(MARKER, dir_fd=fd, follow_symlinks=False)
        except OSError:
            marker = None
        if marker is None or not stat.S_ISREG(marker.st_mode) or marker.st_uid != uid:
            report.foreign += 1  # not a pool, or one still being made
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report.live += 1
            return
        except OSError:
            report.errors += 1
            return
        errors = _empty(fd)
        try:
            os.rmdir(path)
        except OSError:
            errors += 1
        if errors:
            report.errors += 1
        else:
            report.removed += 1
    finally:
        os.close(fd)
