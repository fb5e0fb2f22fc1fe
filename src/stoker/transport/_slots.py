"""Shared-memory slots: created by workers, mapped once by the main process, reused."""

from __future__ import annotations

import ctypes
import errno
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from stoker._introspect.frames import user_stacklevel
from stoker._introspect.platform import shm_dir, shm_free_bytes, shm_total_bytes
from stoker.errors import SharedMemoryError
from stoker.transport._mapping import _PAGE, map_file, populate_write
from stoker.transport._namespace import create_private_file

__all__ = [
    "ALIGN",
    "HEADER_BYTES",
    "SLOT_PREFIX",
    "SlotArena",
    "SlotMap",
    "slot_prefix",
    "unlink_owned",
    "warn_no_room",
]

SLOT_PREFIX = "stoker-"
# Bytes reserved at the start of every slot; byte 0 is the state flag.
HEADER_BYTES = 64
# Alignment of every tensor placed in a slot (cache line; enough for any dtype view).
ALIGN = 64
FREE = 0
BUSY = 1
# A slot is created this much larger than the batch that needed it, to absorb small growth.
GROWTH_FACTOR = 1.25
# Bytes a new slot leaves free in the directory (for the status table, other loaders' first
# slots, and the rest of the system's use of /dev/shm).
SHM_HEADROOM = 1 << 20
# Longest a worker waits for one of its slots to be released when no new one can be made
# (then the batch crosses through the pipe: a training step slower than this gains nothing
# from waiting longer), and how often it looks.
SLOT_WAIT_S = 0.25
SLOT_POLL_S = 0.0005
_NOT_HERE = (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT, errno.EOPNOTSUPP, errno.EINVAL)


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def bump(slot: _Slot | None, top: int, nbytes: int) -> tuple[torch.Tensor | None, int]:
    """``nbytes`` of ``slot`` from offset ``top`` (aligned) as a uint8 tensor, and the offset
    after them; ``(None, top)`` when they do not fit (or there is no slot)."""
    if slot is None:
        return None, top
    start = _round_up(top, ALIGN)
    end = start + nbytes
    if end > slot.size:
        return None, top
    return slot.base[start:end], end


def slot_prefix(owner_pid: int, pool_id: int) -> str:
    """File-name prefix of every slot of worker pool ``pool_id`` of main process ``owner_pid``."""
    return f"{SLOT_PREFIX}{owner_pid}-{pool_id}-"


@dataclass
class _Slot:
    name: str
    buf: ctypes.Array[ctypes.c_uint8]  # owns the mapping
    size: int
    base: torch.Tensor  # uint8 view of the whole mapping
    directory: str
    spilled: bool = False  # in the spill directory: the shared-memory one had no room
    addr: int = field(init=False)

    def __post_init__(self) -> None:
        self.addr = self.base.data_ptr()

    @property
    def free(self) -> bool:
        return self.buf[0] == FREE


class SlotArena:
    """A worker's slots, and a bump allocator over the one holding the current batch.

    Args:
        prefix: file-name prefix of the pool's slots (``slot_prefix(owner_pid, pool_id)``).
        worker_id: the worker's index (goes into slot names).
        budget_bytes: most bytes of slots this worker may hold; beyond it batches take the
            ordinary (pickled) path.
        directory: the pool's private directory (:class:`PoolNamespace`). Default:
            ``stoker._introspect.platform.shm_dir()`` (tests only: a pool never writes there).
        require: raise :class:`SharedMemoryError` when the directory has no room for a slot,
            instead of leaving the batch to the ordinary path (``shm="require"``).
        spill_directory: a private directory on another filesystem (under the temp
            directory) for the slots ``directory`` has no room for; None: no spilling.
        expect: bytes a batch is known to take in a slot, header included (0: unknown). The
            first batch then gets a slot at once and collates into it; else it collates into
            ordinary memory and is copied into a slot sized after it (for ``large``'s 37 MiB
            batch, 44 ms of a fresh worker's first batch).

    Attributes:
        short: slots this arena could not create in ``directory`` for want of room.
        sealed_spilled: the slot :meth:`seal` last handed over is a spilled one.
    """

    def __init__(
        self,
        prefix: str,
        worker_id: int,
        budget_bytes: int,
        directory: str | None = None,
        *,
        require: bool = False,
        spill_directory: str | None = None,
        expect: int = 0,
    ) -> None:
        self._dir = directory or shm_dir()
        self._require = require
        self._spill = None if require else spill_directory
        self.short = 0
        self.sealed_spilled = False
        self._prefix = f"{prefix}w{worker_id}-{os.getpid()}-"
        self._budget = budget_bytes
        self._slots: list[_Slot] = []
        self._counter = 0
        # Size of slot to use for the next batch (0: unknown yet).
        self._want = _round_up(int(expect * GROWTH_FACTOR), _PAGE) if expect > 0 else 0
        self.retired: list[str] = []  # names unlinked since the last header
        self.current: _Slot | None = None
        self._top = HEADER_BYTES

    # -- slot management -----------------------------------------------------------------

    @property
    def held_bytes(self) -> int:
        return sum(s.size for s in self._slots)

    def _create(self, size: int) -> _Slot | None:
        size = _round_up(max(size, _PAGE), _PAGE)
        if self.held_bytes + size > self._budget:
            # Drop free slots first; they are cheaper to recreate than a pickled batch.
            for unused in [s for s in self._slots if s.free and s is not self.current]:
                self._retire(unused)
                if self.held_bytes + size <= self._budget:
                    break
            else:
                return None
        made = self._make(self._dir, size)
        if made is None:
            self.short += 1
            if self._spill is not None:
                made = self._make(self._spill, size)
        if made is None:
            self._no_room(size)
            return None
        made.spilled = made.directory == self._spill
        self._slots.append(made)
        return made

    def _make(self, directory: str, size: int) -> _Slot | None:
        """A new slot of ``size`` bytes in ``directory``; None when it has no room."""
        # A directory without room is seen before trying: a failed fallocate on tmpfs
        # allocates (and zeroes) every free page before giving them back.
        if shm_free_bytes(directory) < size + SHM_HEADROOM:
            return None
        self._counter += 1
        name = f"{self._prefix}{self._counter}"
        path = os.path.join(directory, name)
        fd = create_private_file(path)
        try:
            try:
                # Reserve the pages now: a full tmpfs fails here with ENOSPC instead of
                # killing a process with SIGBUS on first touch.
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                os.unlink(path)
                # No room, or a filesystem that cannot reserve (NFS as TMPDIR): not here.
                if exc.errno in _NOT_HERE:
                    return None
                raise
        finally:
            os.close(fd)
        buf = map_file(path, size)
        return _Slot(name, buf, size, torch.frombuffer(buf, dtype=torch.uint8), directory)

    def _no_room(self, size: int) -> None:
        """No directory can hold a slot of ``size`` now: the batch takes the ordinary path
        (the pipe), or, with ``require``, the error."""
        if not self._require:
            return
        mib = 1 << 20
        shared = os.path.dirname(self._dir) or self._dir  # the tmpfs, not the pool's folder
        raise SharedMemoryError(
            errno.ENOSPC,
            f"{shared} has {shm_free_bytes(self._dir) / mib:.1f} MiB free but a batch slot "
            f"needs {size / mib:.1f} MiB: give the container more shared memory (`docker run "
            "--shm-size=1g`), set "
            "STOKER_SHM_DIR to a larger tmpfs, or lower `prefetch_factor`/`batch_size` "
            '(`shm="require"` makes this an error; by default such batches go to files under '
            "the temp directory, or through the pipe).",
        )

    def _retire(self, slot: _Slot) -> None:
        self._slots.remove(slot)
        try:
            os.unlink(os.path.join(slot.directory, slot.name))
        except FileNotFoundError:
            pass
        self.retired.append(slot.name)

    def begin(self, *, wait: bool = False) -> None:
        """Start a batch: pick a free slot of the current size, or create one.

        Args:
            wait: when no slot can be made, wait for one of this worker's slots to be
                released (:meth:`reserve` does, once the batch is loaded: a worker never
                waits for a slot before loading, so loading overlaps the wait).
        """
        self.current = None
        self._top = HEADER_BYTES
        if not self._want:
            return
        for slot in self._slots:
            if slot.free:
                if slot.size >= self._want:
                    self.current = slot
                    return
        # Undersized free slots are of no further use.
        for slot in [s for s in self._slots if s.free and s.size < self._want]:
            self._retire(slot)
        self.current = self._create(self._want)
        if self.current is None and wait:
            self.current = self._await_release(self._want)

    def prepare(self) -> None:
        """Make the slot the next batch takes now, its pages faulted in, where its size is
        known (``expect``): a worker does so before its first task comes, which then does
        not wait for it (reserving and faulting in large's 46 MiB slot took a fresh worker
        20-40 ms on the 2-core VM)."""
        if not self._want or any(s.free and s.size >= self._want for s in self._slots):
            return
        slot = self._create(self._want)
        if slot is not None:
            populate_write(slot.addr, slot.size)

    def _await_release(self, size: int) -> _Slot | None:
        """No new slot can be made (no room, or over budget): wait up to
        :data:`SLOT_WAIT_S` for the training loop to drop a batch held in one of this
        worker's slots, so that a small directory means fewer batches in flight rather than
        batches through the pipe; None if none is released in time."""
        held = [s for s in self._slots if s.size >= size]
        if not held:
            return None
        deadline = time.monotonic() + SLOT_WAIT_S
        while True:
            for slot in held:
                if slot.free:
                    return slot
            if time.monotonic() >= deadline:
                return None
            time.sleep(SLOT_POLL_S)

    def reserve(self, needed: int) -> bool:
        """Make the current slot one that holds ``needed`` data bytes; False if over budget.

        Tensors already placed in a previous current slot must be placed again by the caller.
        """
        total = HEADER_BYTES + needed
        self._want = max(self._want, _round_up(int(total * GROWTH_FACTOR), _PAGE))
        self.current = None
        self.begin(wait=True)
        self._top = HEADER_BYTES
        return self.current is not None

    def alloc(self, nbytes: int) -> torch.Tensor | None:
        """``nbytes`` of the current slot as a uint8 tensor, or None when it does not fit."""
        got, self._top = bump(self.current, self._top, nbytes)
        return got

    def seal(self) -> str | None:
        """Mark the current slot BUSY (handed to the main process); returns its name."""
        slot = self.current
        if slot is None:
            return None
        slot.buf[0] = BUSY
        self.current = None
        self.sealed_spilled = slot.spilled
        return slot.name

    def take_retired(self) -> list[str]:
        names, self.retired = self.retired, []
        return names

    def close(self) -> None:
        """Unlink this worker's free slots (mappings stay valid until unmapped).

        A slot holding a batch already handed over stays: its header may still be in the
        pipe, unread, and the main process has to map the file. The main process unlinks
        those when the worker has left (or with the whole pool at shutdown).
        """
        for slot in list(self._slots):
            if slot.free:
                self._retire(slot)
        self.retired.clear()


class SlotMap:
    """The main process's mappings of worker slots, opened once by name and reused.

    A mapping holds no file descriptor; it is unmapped once the map forgets it and no batch
    views it any more.

    Args:
        directory: the pool's private directory. Default: ``stoker._introspect.platform.shm_dir()``.
    """

    def __init__(
        self, directory: str | None = None, registry: Any = None, spill: str | None = None
    ) -> None:
        self._dir = directory or shm_dir()
        self._spill = spill  # the pool's spill directory (see SlotArena)
        self._maps: dict[str, ctypes.Array[ctypes.c_uint8]] = {}
        # Page-locks each slot once (stoker.device.HostRegistry) when batches go to a GPU.
        self.registry = registry

    def __len__(self) -> int:
        return len(self._maps)

    def __contains__(self, name: object) -> bool:
        return name in self._maps

    @property
    def nbytes(self) -> int:
        return sum(len(m) for m in self._maps.values())

    def busy(self) -> int:
        """Slots whose state byte says a batch is queued in them or still referenced."""
        return sum(1 for m in self._maps.values() if m[0] != FREE)

    def open(self, name: str) -> ctypes.Array[ctypes.c_uint8]:
        """The byte array over slot ``name``, mapped on first use."""
        buf = self._maps.get(name)
        if buf is None:
            try:
                buf = map_file(os.path.join(self._dir, name))
            except FileNotFoundError:
                if self._spill is None:
                    raise
                buf = map_file(os.path.join(self._spill, name))  # a spilled slot
            self._maps[name] = buf
            registry = self.registry
            if registry is not None:
                addr = ctypes.addressof(buf)
                if registry.register(addr, len(buf)):
                    buf.unmapper.before_unmap = registry.unregister
        return buf

    def forget(self, names: list[str]) -> None:
        """Drop mappings of slots their worker retired (memory goes once no view uses it)."""
        for name in names:
            self._maps.pop(name, None)

    def forget_prefix(self, prefix: str) -> None:
        """Drop the mappings of every slot whose name starts with ``prefix`` (a worker's)."""
        for name in [n for n in self._maps if n.startswith(prefix)]:
            del self._maps[name]

    def release(self, name: str) -> None:
        """Mark slot ``name`` FREE without delivering its batch (stale or abandoned)."""
        release(self.open(name))

    def clear(self) -> None:
        self._maps.clear()


def release(buf: ctypes.Array[ctypes.c_uint8]) -> None:
    """Finalizer: the last view of a batch is gone; the worker may reuse its slot."""
    buf[0] = FREE


def unlink_owned(prefix: str, directory: str | None = None) -> int:
    """Unlink every slot file whose name starts with ``prefix``; returns how many."""
    d = directory or shm_dir()
    count = 0
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(d, name))
                count += 1
            except FileNotFoundError:
                pass
    return count


def warn_no_room(directory: str, batch_bytes: int, spill: str | None = None) -> None:
    """Warn (once per loader: the caller's to ensure) that a batch found no room in shared
    memory and went to a slot in ``spill`` (a private directory under the temp directory) or,
    with ``spill=None``, through the pipe."""
    mib = 1 << 20
    directory = directory or shm_dir()
    where = (
        f"went to a slot in {os.path.dirname(spill)} instead (page cache: about as fast, but "
        "the kernel may write it to disk)"
        if spill
        else "crossed through the pipe, which copies it twice"
    )
    warnings.warn(
        f"a batch of {batch_bytes / mib:.1f} MiB did not fit in a shared-memory slot "
        f"({os.path.dirname(directory) or directory}: {shm_free_bytes(directory) / mib:.1f} MiB "
        f"free of {shm_total_bytes(directory) / mib:.1f} MiB) and {where}; later batches that "
        "do not fit do the same, nothing is lost. "
        "Give the container more shared memory (`docker run --shm-size=1g`), point "
        "STOKER_SHM_DIR at a larger tmpfs, or lower `batch_size`/`prefetch_factor`; "
        '`shm="require"` makes this an error instead.',
        RuntimeWarning,
        stacklevel=user_stacklevel(),
    )
