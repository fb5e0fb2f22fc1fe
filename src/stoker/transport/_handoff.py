"""One batch handed from a forked child to its parent through an anonymous memory file.

The child creates the file with ``memfd_create``: it has no name in any directory, so no other
user can see or swap it, a small ``/dev/shm`` does not limit it, and a crash leaves nothing
behind. It encodes the batch into the file as a worker encodes into a slot
(:func:`~stoker.transport.encode`), writes the header after the data, and passes the file's
descriptor over a Unix socket (``SCM_RIGHTS``); the parent maps it and decodes views over it
(:func:`unpack`), and the memory goes with the last view. A child that collates with
:func:`open_arena`'s arena installed (``stoker.workers._collate``) stacks the batch's tensors
straight into the file, which is made large and sparse for that: they are not copied again
(copying ``large``'s 36.8 MiB batch into the file took the child 61 ms on the 2-core VM). The
parent never holds the file before the batch is ready, so the workers it forks meanwhile do not
inherit it (and keep its memory for their lives). Pickling the batch through a pipe instead
costs far more: a 36.8 MiB batch from a forked child arrived 190-290 ms after it was made and
took 123-141 ms more to unpickle (benchmarks/README.md).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from stoker.transport._codec import decode, encode
from stoker.transport._mapping import map_fd, populate_write
from stoker.transport._slots import _PAGE, ALIGN, HEADER_BYTES, _round_up, _Slot, bump

__all__ = [
    "ARENA_RESERVE",
    "HANDOFF_SLOT",
    "HandoffArena",
    "handoff_file",
    "open_arena",
    "pack",
    "unpack",
]

# The name the header gives the file's one slot (the parent knows which file it is).
HANDOFF_SLOT = "handoff"


def handoff_file() -> int | None:
    """A new anonymous memory file's descriptor (close-on-exec), or None where the system
    cannot make one (no ``memfd_create``: not Linux)."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        return int(create("stoker-handoff", getattr(os, "MFD_CLOEXEC", 0)))
    except OSError:
        return None


# Bytes a file made for collation is sized to (sparse: only the pages written hold memory);
# a batch that outgrows it is left to a worker.
ARENA_RESERVE = 1 << 30
# Bytes given out at once from which their pages are faulted in with one call: fewer pages
# fault as cheaply one at a time.
POPULATE_BYTES = 1 << 16


class HandoffArena:
    """The arena :func:`~stoker.transport.encode` places one batch in: the memory file
    ``fd``, sized to what the batch needs, or to ``reserve`` bytes at once when collation is
    to write into it (see :func:`open_arena`).

    Args:
        fd: a file from :func:`handoff_file`.
        reserve: bytes to size and map the file to at once (0: when the batch asks).
    """

    def __init__(self, fd: int, reserve: int = 0) -> None:
        self.fd = fd
        self.current: _Slot | None = None
        self._top = HEADER_BYTES
        if reserve:
            self._map(reserve)

    @property
    def used(self) -> int:
        """Bytes from the file's start to the end of the last bytes given out."""
        return self._top

    def _map(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        buf = map_fd(self.fd, size, "the hand-off file")
        self.current = _Slot(HANDOFF_SLOT, buf, size, torch.frombuffer(buf, dtype=torch.uint8), "")
        self._top = HEADER_BYTES

    def reserve(self, needed: int) -> bool:
        """Make the file hold ``needed`` data bytes (after the header) and map it; refused
        (False) once bytes were given out, which collation may have written."""
        if self._top > HEADER_BYTES:
            return False
        self._map(_round_up(HEADER_BYTES + needed + ALIGN * 8, _PAGE))
        return True

    def alloc(self, nbytes: int) -> torch.Tensor | None:
        """``nbytes`` of the file as a uint8 tensor, or None when they do not fit; its pages
        are faulted in at once where there are many (see :func:`populate_write`)."""
        got, self._top = bump(self.current, self._top, nbytes)
        if got is not None and nbytes >= POPULATE_BYTES:
            populate_write(got.data_ptr(), nbytes)
        return got

    def seal(self) -> str | None:
        """The slot's name for the header (None: nothing was placed)."""
        slot, self.current = self.current, None
        return None if slot is None else slot.name


def open_arena(reserve: int = ARENA_RESERVE) -> HandoffArena | None:
    """A new memory file sized and mapped to ``reserve`` bytes, as an arena that collation
    can write into before :func:`pack`; None where none can be made or mapped."""
    fd = handoff_file()
    if fd is None:
        return None
    try:
        return HandoffArena(fd, reserve)
    except (OSError, ValueError):
        os.close(fd)
        return None


def pack(
    batch: Any, arena: HandoffArena | None = None
) -> tuple[int, tuple[str | None, int, int]] | None:
    """Encode ``batch`` into a memory file (the child's side); returns the file's descriptor
    and ``(slot, header offset, header length)`` for :func:`unpack`, or None where no memory
    file can be made or the batch outgrows ``arena``.

    Args:
        batch: the batch.
        arena: the arena from :func:`open_arena` that collation wrote the batch's tensors
            into (they stay where they are; the file is cut to what it holds), or None for a
            new file. It is closed when None is returned.
    """
    if arena is None:
        fd = handoff_file()
        if fd is None:
            return None
        arena = HandoffArena(fd)
    fd = arena.fd
    try:
        enc = encode(batch, arena)
        if enc.fallback:  # (pickled whole: a worker loads it better)
            os.close(fd)
            return None
        # After the data: the bytes past it are never written (a reserved file shrinks to
        # them), and whole pages (the decoder views the mapping as every dtype).
        offset = _round_up(arena.used, ALIGN) if enc.slot is not None else 0
        os.ftruncate(fd, _round_up(offset + len(enc.payload), _PAGE))
        written = 0
        while written < len(enc.payload):
            written += os.pwrite(fd, memoryview(enc.payload)[written:], offset + written)
    except BaseException:
        os.close(fd)
        raise
    return fd, (enc.slot, offset, len(enc.payload))


def unpack(fd: int, slot: str | None, offset: int, length: int) -> Any:
    """The batch :func:`pack` put in the memory file ``fd`` (the parent's side); its tensors
    view the file's pages. ``fd`` stays open (the caller closes it).

    Raises:
        ValueError: if the file is shorter than the header's place says, or names another slot.
    """
    if slot is not None and slot != HANDOFF_SLOT:
        raise ValueError(f"a hand-off header names slot {slot!r}, not {HANDOFF_SLOT!r}")
    size = os.fstat(fd).st_size
    if offset < 0 or length < 0 or offset + length > size or size % _PAGE or size == 0:
        raise ValueError(
            f"a hand-off header at bytes {offset}-{offset + length} of a {size}-byte file"
        )
    buf = map_fd(fd, size, "the hand-off file", populate=True)
    payload = memoryview(buf)[offset : offset + length].tobytes()
    if slot is None:  # no tensor or array: the header is the whole batch
        return decode(payload, None, None)
    return decode(payload, slot, None, buf)
