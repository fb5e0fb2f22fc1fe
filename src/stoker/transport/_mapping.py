"""Shared file mappings that hold no file descriptor.

CPython's ``mmap.mmap`` keeps a duplicate of the file descriptor for the mapping's whole
life, so a loader with hundreds of slots would hold hundreds of fds (and hit a low
``RLIMIT_NOFILE``). :func:`map_file` maps the file with libc's ``mmap``, closes the fd at
once, and returns a ctypes byte array over the mapping that unmaps it when the array and
everything viewing it (``numpy.frombuffer``, ``torch.frombuffer``) are gone.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

__all__ = ["map_fd", "map_file", "populate_write"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
# Linux 5.14+: fault a range in writable with one call (older kernels answer EINVAL).
_MADV_POPULATE_WRITE = 23
_PAGE = mmap.PAGESIZE
_MAP_FAILED = ctypes.c_void_p(-1).value
_munmap = _libc.munmap  # bound early: __del__ may run during interpreter teardown


class _Unmapper:
    """Unmaps a region when collected; held only by the byte array over that region."""

    __slots__ = ("addr", "before_unmap", "size")

    def __init__(self, addr: int, size: int) -> None:
        self.addr = addr
        self.size = size
        self.before_unmap: Any = None  # e.g. cudaHostUnregister of a pinned slot

    def __del__(self) -> None:
        if self.addr:
            hook, self.before_unmap = self.before_unmap, None
            if hook is not None:
                try:
                    hook(self.addr)
                except Exception:
                    pass
            _munmap(self.addr, self.size)
            self.addr = 0


def map_file(path: str, size: int | None = None) -> Any:
    """Map ``path`` read-write and shared; returns a ``ctypes.c_uint8`` array over it.

    Args:
        path: the file; it must exist with at least ``size`` bytes.
        size: bytes to map. Default: the file's size.

    Returns:
        A byte array (buffer protocol, indexable: ``buf[0] = 1``) that owns the mapping.

    Raises:
        OSError: if the file cannot be opened or mapped.
    """
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return map_fd(fd, size, path)
    finally:
        os.close(fd)


def map_fd(fd: int, size: int | None = None, what: str = "", populate: bool = False) -> Any:
    """Map the open file ``fd`` (read-write, shared) as :func:`map_file` maps a path; the
    mapping does not keep ``fd``, which the caller closes. ``populate``: map every page at
    once (``MAP_POPULATE``), for a file already written that will be read whole.

    Raises:
        OSError: if the file cannot be mapped (``what`` names it in the message).
    """
    if size is None:
        size = os.fstat(fd).st_size
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(
            err, f"mmap of {what or f'fd {fd}'} ({size} bytes) failed: {os.strerror(err)}"
        )
    # A subclass per size gets a __dict__, so the array can own its unmapper.
    array_type: Any = type("SlotBytes", (ctypes.c_uint8 * size,), {})
    buf = array_type.from_address(addr)
    buf.unmapper = _Unmapper(addr, size)
    return buf


def populate_write(addr: int, nbytes: int) -> bool:
    """Fault the pages of a shared mapping holding ``[addr, addr + nbytes)`` in, writable, in
    one call, before they are written: a fresh memory file's pages faulted one at a time cost
    the head start's child 4-6 ms of large's 37 MiB batch (``madvise(MADV_POPULATE_WRITE)``).
    Returns False where the kernel cannot (the pages then fault as they are written)."""
    start = addr - addr % _PAGE
    end = -(-(addr + nbytes) // _PAGE) * _PAGE
    return _libc.madvise(start, end - start, _MADV_POPULATE_WRITE) == 0
