"""A task queue many workers read without a lock.

Every task travels as one record of exactly :data:`RECORD` bytes (``PIPE_BUF`` on Linux).
Pipe writes of at most ``PIPE_BUF`` bytes are atomic, and every reader asks for exactly one
record, so each read returns one whole record: no reader lock exists that a worker killed
mid-read could leave held, and the main process can drain the queue at any time (it does
after a worker dies, to find the batches that worker took). A task too large for a record
(a batch of thousands of indices) is written to a file in the pool's private directory and the
record names it, with its length and SHA-256 digest; a reader accepts only a name with the
queue's prefix, in that directory, only a regular file of this user, and only the bytes the
record's digest vouches for (the record crosses the pipe, which no other process can write to;
the file could be replaced by a process with this uid, or root in another container that
shares /dev/shm, and a task is unpickled).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import select
import struct
from typing import Any

from stoker.transport import create_private_file, open_private_file

__all__ = ["RECORD", "TaskQueue"]

RECORD = 4096  # == PIPE_BUF on Linux: writes up to this size are atomic
_LEN = struct.Struct("<I")
_SIZE = struct.Struct("<Q")
_INLINE = RECORD - _LEN.size
_OVERFLOW = 0xFFFFFFFF


class TaskQueue:
    """Fixed-size records over a pipe.

    Args:
        reader: the read end (a ``multiprocessing.connection.Connection``).
        writer: the write end.
        overflow_prefix: path prefix for tasks larger than a record (in the pool's private
            directory).
    """

    def __init__(self, reader: Any, writer: Any, overflow_prefix: str) -> None:
        self.reader = reader
        self.writer = writer
        self.overflow_prefix = overflow_prefix
        self._overflow_count = 0

    def __getstate__(self) -> dict[str, Any]:  # sent to spawned workers
        return {"reader": self.reader, "writer": None, "overflow_prefix": self.overflow_prefix}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._overflow_count = 0

    def put(self, data: bytes) -> None:
        """Append one task (main process only)."""
        if len(data) <= _INLINE:
            record = _LEN.pack(len(data)) + data
        else:
            self._overflow_count += 1
            path = f"{self.overflow_prefix}{self._overflow_count}"
            with os.fdopen(create_private_file(path, os.O_WRONLY), "wb") as f:
                f.write(data)
            name = os.path.basename(path).encode()
            digest = hashlib.sha256(data).digest()
            record = (
                _LEN.pack(_OVERFLOW) + _LEN.pack(len(name)) + name + _SIZE.pack(len(data)) + digest
            )
        os.write(self.writer.fileno(), record.ljust(RECORD, b"\0"))

    def _decode(self, record: bytes) -> bytes:
        (n,) = _LEN.unpack_from(record)
        if n != _OVERFLOW:
            return record[_LEN.size : _LEN.size + n]
        (m,) = _LEN.unpack_from(record, _LEN.size)
        end = 2 * _LEN.size + m
        name = record[2 * _LEN.size : end].decode()
        (size,) = _SIZE.unpack_from(record, end)
        digest = record[end + _SIZE.size : end + _SIZE.size + 32]
        prefix = os.path.basename(self.overflow_prefix)
        if os.sep in name or not name.startswith(prefix):
            raise ValueError(f"task record names {name!r}, not one of this queue's files")
        path = os.path.join(os.path.dirname(self.overflow_prefix), name)
        with os.fdopen(open_private_file(path), "rb") as f:
            data = f.read(size + 1)  # never more than the record says, however large the file
        os.unlink(path)
        if len(data) != size or not hmac.compare_digest(hashlib.sha256(data).digest(), digest):
            raise ValueError(
                f"task file {path} was changed after the main process wrote it ({len(data)} "
                f"bytes, {size} written): another process with access to the shared-memory "
                "directory replaced it; the task is not read"
            )
        return data

    def get(self) -> bytes:
        """Take the next task, blocking (any process).

        Raises:
            EOFError: when every write end is closed.
        """
        fd = self.reader.fileno()
        record = _read(fd, RECORD)
        if not record:
            raise EOFError
        while len(record) < RECORD:  # cannot happen with whole-record writes; be safe
            more = _read(fd, RECORD - len(record))
            if not more:
                raise EOFError
            record += more
        return self._decode(record)

    def drain(self) -> list[bytes]:
        """Take every task no worker has taken yet, without blocking (main process).

        Workers read the same pipe: between a poll that saw a record and the read, a worker
        could take it and the read would block for good (a test hung so). The read end is
        switched to non-blocking while draining; a worker that reads meanwhile waits in
        :func:`_read` instead.
        """
        fd = self.reader.fileno()
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        out: list[bytes] = []
        try:
            while True:
                try:
                    record = os.read(fd, RECORD)
                except BlockingIOError:
                    return out
                if not record:
                    return out
                out.append(self._decode(record))  # whole: records are written atomically
        finally:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def _read(fd: int, n: int) -> bytes:
    """``os.read``, waiting while the main process drains the queue (non-blocking then)."""
    while True:
        try:
            return os.read(fd, n)
        except BlockingIOError:
            select.select([fd], [], [])
