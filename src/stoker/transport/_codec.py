"""Encoding a batch into a slot plus a small header, and rebuilding it as zero-copy views.

The header is a pickle of the batch in which every CPU tensor and numpy array is replaced by a
persistent id ``(kind, offset, dtype, shape)`` pointing into the slot; everything else
(strings, ints, dicts, dataclasses, ...) is pickled as usual. Decoding maps the ids back to
views of one owner array whose finalizer frees the slot once the last view is gone.
"""

from __future__ import annotations

import io
import pickle
import weakref
from typing import Any

import numpy as np
import torch

from stoker.transport._slots import ALIGN, SlotArena, SlotMap, release

__all__ = ["EncodedBatch", "decode", "encode"]

_DTYPES: tuple[torch.dtype, ...] = tuple(
    dt
    for dt in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
        torch.complex64,
        torch.complex128,
        getattr(torch, "uint16", None),
        getattr(torch, "uint32", None),
        getattr(torch, "uint64", None),
        getattr(torch, "float8_e4m3fn", None),
        getattr(torch, "float8_e5m2", None),
    )
    if dt is not None
)
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_PROTOCOL = 5


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _SlotPickler(pickle.Pickler):
    """Places tensors and arrays in the arena's current slot; counts bytes when it cannot."""

    def __init__(self, buf: io.BytesIO, arena: SlotArena) -> None:
        super().__init__(buf, protocol=_PROTOCOL)
        self.arena = arena
        self.needed = 0  # bytes all placeable leaves need (aligned)
        self.placed = 0  # leaves placed in the slot
        self.overflow = False

    def persistent_id(self, obj: Any) -> Any:
        t = type(obj)
        if t is torch.Tensor:
            if (
                obj.device.type != "cpu"
                or obj.layout != torch.strided
                or obj.requires_grad
                or obj.dtype not in _CODE
            ):
                return None
            nbytes = obj.numel() * obj.element_size()
            self.needed += _aligned(nbytes)
            if self.overflow:
                return ("T", -1, 0, ())
            arena = self.arena
            off = arena.offset_of(obj) if obj.is_contiguous() else None
            if off is None:
                dst = arena.alloc(nbytes)
                if dst is None:
                    self.overflow = True
                    return ("T", -1, 0, ())
                if nbytes:
                    dst.view(obj.dtype).view(obj.shape).copy_(obj.resolve_conj().resolve_neg())
                off = dst.data_ptr() - arena.current.addr  # type: ignore[union-attr]
            self.placed += 1
            return ("T", off, _CODE[obj.dtype], tuple(obj.shape))
        if t is np.ndarray and not obj.dtype.hasobject:
            nbytes = obj.nbytes
            self.needed += _aligned(nbytes)
            if self.overflow:
                return ("N", -1, obj.dtype, ())
            dst = self.arena.alloc(nbytes)
            if dst is None:
                self.overflow = True
                return ("N", -1, obj.dtype, ())
            if nbytes:
                dst.numpy().view(obj.dtype).reshape(obj.shape)[...] = obj
            off = dst.data_ptr() - self.arena.current.addr  # type: ignore[union-attr]
            self.placed += 1
            return ("N", off, obj.dtype, obj.shape)
        return None


class EncodedBatch:
    """What a worker sends for one batch: the header bytes and the slot holding the data."""

    __slots__ = ("fallback", "payload", "slot")

    def __init__(self, payload: bytes, slot: str | None, fallback: bool) -> None:
        self.payload = payload
        self.slot = slot
        self.fallback = fallback


def _try_encode(batch: Any, arena: SlotArena) -> tuple[bytes, _SlotPickler]:
    buf = io.BytesIO()
    pickler = _SlotPickler(buf, arena)
    pickler.dump(batch)
    return buf.getvalue(), pickler


def encode(batch: Any, arena: SlotArena) -> EncodedBatch:
    """Place ``batch``'s tensors and arrays in a slot and pickle the rest into a header.

    The arena's current slot may already hold tensors that collation wrote in place. When the
    batch does not fit, a larger slot is taken and everything is placed again; when the
    worker's slot budget forbids that, the batch is pickled whole (the ordinary path).
    """
    payload, pickler = _try_encode(batch, arena)
    if pickler.overflow or (pickler.placed and arena.current is None):
        if arena.reserve(pickler.needed):
            payload, pickler = _try_encode(batch, arena)
        if pickler.overflow or arena.current is None:
            arena.current = None
            return EncodedBatch(pickle.dumps(batch, protocol=_PROTOCOL), None, True)
    if not pickler.placed:
        arena.current = None  # nothing in the slot: leave it free for the next batch
        return EncodedBatch(payload, None, False)
    return EncodedBatch(payload, arena.seal(), False)


class _ViewUnpickler(pickle.Unpickler):
    def __init__(self, buf: io.BytesIO, owner: np.ndarray) -> None:
        super().__init__(buf)
        self.owner = owner
        self.base: torch.Tensor | None = None

    def persistent_load(self, pid: Any) -> Any:
        kind, off, dtype, shape = pid
        if kind == "T":
            dt = _DTYPES[dtype]
            if self.base is None:
                self.base = torch.from_numpy(self.owner)
            numel = 1
            for s in shape:
                numel *= s
            nbytes = numel * dt.itemsize
            return self.base[off : off + nbytes].view(dt).view(shape)
        if kind == "N":
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            return self.owner[off : off + nbytes].view(dtype).reshape(shape)
        raise pickle.UnpicklingError(f"unknown persistent id kind {kind!r}")


def decode(payload: bytes, slot: str | None, slots: SlotMap, buf: Any = None) -> Any:
    """Rebuild a batch; its tensors view the slot, which is freed when the last view dies.

    ``buf``: the slot's mapping, if the caller opened it already (``slots.open(slot)``).
    """
    if slot is None:
        return pickle.loads(payload)
    if buf is None:
        buf = slots.open(slot)
    owner = np.frombuffer(buf, dtype=np.uint8)
    finalizer = weakref.finalize(owner, release, buf)
    finalizer.atexit = False
    unpickler = _ViewUnpickler(io.BytesIO(payload), owner)
    del owner
    return unpickler.load()
