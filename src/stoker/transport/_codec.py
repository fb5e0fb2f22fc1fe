"""Encoding a batch into a slot plus a small header, and rebuilding it as zero-copy views.

The payload is two pickles: a table with one entry per CPU tensor or numpy array of the batch
(a *leaf*: where it lies in the slot, its dtype, shape and strides), then the batch itself with
every leaf replaced by a persistent id, its index in the table; everything else (strings, ints,
dicts, dataclasses, ...) is pickled as usual. Decoding maps each index back to a view of one
owner array whose finalizer frees the slot once the last view is gone.

The table is built after the batch is pickled, when all its leaves are known, so that the batch
keeps the relations between its tensors that torch's own worker path keeps:

* Identity: an object that appears twice in the batch is one leaf and decodes to one object.
* Aliasing: tensors whose bytes overlap in one storage (``x`` and ``x[:2]``, ``x`` and ``x.t()``)
  are placed as one copy of the span of storage they cover, and each decodes as a view of that
  copy with its own offset and strides, so that an in-place change of one shows in the others.
  Fallback: when that span would be more than ``_MAX_SPAN_WASTE`` times the bytes the tensors
  hold (``big[:, 0]`` and ``big[0]`` of a large ``big`` that is not itself in the batch), each
  tensor is copied on its own instead, as if it had no alias: a batch is not allowed to carry
  a large storage for a few elements, and those tensors no longer alias after decoding.
  Tensors whose bytes do not overlap (two slices far apart) are placed apart even when they
  share a storage: nothing is lost, as no change to one can show in the other.
* Layout: a tensor whose strides are a permutation of a contiguous layout (``channels_last``,
  a transpose), or that is part of an aliased span, keeps its strides; a tensor with any
  other layout (gaps, expanded dimensions) copied on its own arrives contiguous.

Tensors that collation wrote into the slot in place, and views of them in any layout, are not
copied at all. Numpy arrays keep their identity but are always copied, C-contiguous, one per
array (views of one array do not alias after decoding, as with torch's pickled arrays).
"""

from __future__ import annotations

import io
import pickle
import weakref
from typing import Any, Protocol

import numpy as np
import torch

from stoker.transport._slots import ALIGN, HEADER_BYTES, SlotMap, _Slot, release

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
_ITEMSIZE = tuple(dt.itemsize for dt in _DTYPES)
_COMPLEX = frozenset(i for i, dt in enumerate(_DTYPES) if dt.is_complex)
_PROTOCOL = 5
# An aliased span is copied whole only while it is at most this many times the bytes its
# tensors hold; past that its tensors are copied one by one.
_MAX_SPAN_WASTE = 2
# A copied span starts at a multiple of the largest element size, so that every tensor in it,
# of any dtype, stays aligned to its element size in the slot.
_MAX_ITEMSIZE = max(_ITEMSIZE)
# Table entry flags: bits of a tensor whose storage bytes were placed as they are (not
# resolved by a copy), set again on decode.
_CONJ = 1
_NEG = 2


class Arena(Protocol):
    """Where :func:`encode` places a batch: a worker's :class:`SlotArena`, or the one-batch
    arena of :mod:`stoker.transport._handoff`."""

    current: _Slot | None

    def alloc(self, nbytes: int) -> torch.Tensor | None: ...

    def reserve(self, needed: int) -> bool: ...

    def seal(self) -> str | None: ...


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """``Tensor.is_contiguous()`` for a tensor with elements, without asking the tensor."""
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _is_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether the strides are a permutation of a contiguous layout: no gap, no overlap."""
    expected = 1
    for size, stride in sorted(zip(shape, strides, strict=True), key=lambda d: d[1]):
        if size == 1:
            continue  # any stride goes for a dimension of one
        if stride != expected:
            return False
        expected *= size
    return True


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


# A tensor leaf with elements: (first byte and end byte of what it reaches in its storage,
# the storage's data pointer, nbytes, leaf index, tensor, dtype code, shape, strides).
# Pieces sort by where they start.
_Piece = tuple[int, int, int, int, int, torch.Tensor, int, tuple[int, ...], tuple[int, ...]]


class _LeafPickler(pickle.Pickler):
    """Pickles a batch with each tensor and array replaced by its index among the leaves.

    It also plans where the leaves go: :meth:`plan` sorts the tensors into those placed on
    their own and spans of aliased tensors placed as one copy, and counts ``needed``, the
    bytes they all take in a fresh slot.

    ``persistent_id`` runs before pickle's memo, so the same object is looked up by ``id``
    here; ``leaves`` keeps every object alive until the encode ends, so no id is reused.
    """

    def __init__(self, buf: io.BytesIO) -> None:
        super().__init__(buf, protocol=_PROTOCOL)
        self.leaves: list[Any] = []
        self.entries: list[Any] = []  # table entries known before placing, by leaf index
        self.arrays: list[tuple[int, np.ndarray]] = []
        self.singles: list[_Piece] = []  # tensors placed on their own
        self.spans: list[list[_Piece]] = []  # aliased tensors placed as one copy of a span
        self.needed = 0
        self._index: dict[int, int] = {}
        self._by_storage: dict[int, list[_Piece]] = {}

    def persistent_id(self, obj: Any) -> Any:
        t = type(obj)
        if t is torch.Tensor:
            code = _CODE.get(obj.dtype)
            if (
                code is None
                or not obj.is_cpu
                or obj.layout is not torch.strided
                or obj.is_nested
                or obj.requires_grad
            ):
                return None
        elif t is np.ndarray and not obj.dtype.hasobject:
            code = -1
        else:
            return None
        index = self._index.get(id(obj))
        if index is not None:
            return index
        index = self._index[id(obj)] = len(self.leaves)
        self.leaves.append(obj)
        self.entries.append(None)
        if code < 0:
            self.arrays.append((index, obj))
            self.needed += _aligned(obj.nbytes)
            return index
        # Attributes are read once: in a worker, right after collation has flushed the CPU
        # caches, each call into torch costs about a microsecond.
        shape = tuple(obj.shape)
        strides = obj.stride()
        numel = 1
        reach = 0  # elements past the first one that the layout reaches
        for n, s in zip(shape, strides, strict=True):
            numel *= n
            reach += (n - 1) * s
        if numel == 0:
            self.entries[index] = ("T", code, shape, strides, 0, 0)  # needs no bytes
            return index
        size = _ITEMSIZE[code]
        lo = obj.storage_offset() * size
        storage = obj.data_ptr() - lo
        hi = lo + (reach + 1) * size
        piece = (lo, hi, storage, numel * size, index, obj, code, shape, strides)
        pieces = self._by_storage.get(storage)
        if pieces is None:
            self._by_storage[storage] = [piece]
        else:
            pieces.append(piece)
        return index

    def plan(self) -> None:
        """Sort the tensors into singles and spans; count ``needed``."""
        for pieces in self._by_storage.values():
            if len(pieces) == 1:
                self.singles += pieces
                self.needed += _aligned(pieces[0][3])
                continue
            # Tensors of one storage whose byte ranges overlap must share one copy of a span.
            pieces.sort()
            span = [pieces[0]]
            end = pieces[0][1]
            for p in [*pieces[1:], None]:
                if p is not None and p[0] < end:
                    span.append(p)
                    end = max(end, p[1])
                    continue
                held = sum(q[3] for q in span)
                lo = span[0][0]
                if len(span) > 1 and end - lo <= _MAX_SPAN_WASTE * held:
                    self.spans.append(span)
                    self.needed += _aligned(end - lo + lo % _MAX_ITEMSIZE)
                else:  # one tensor, or a span too sparse to carry: copy each on its own
                    self.singles += span
                    self.needed += sum(_aligned(q[3]) for q in span)
                if p is not None:
                    span = [p]
                    end = p[1]


def _flags(t: torch.Tensor, code: int) -> int:
    conj = code in _COMPLEX and t.is_conj()  # only complex tensors have the bit
    return (_CONJ if conj else 0) | (_NEG if t.is_neg() else 0)


def _place(pickler: _LeafPickler, arena: Arena) -> list[Any] | None:
    """Place the planned leaves in the arena's current slot; their table, or None if full.

    A tensor that views the slot's own storage past its header (what collation wrote there
    in place, or a view of that) is not copied.
    """
    slot = arena.current
    if slot is None:
        return None
    addr = slot.addr
    entries = pickler.entries.copy()
    for lo, _, storage, nbytes, index, t, code, shape, strides in pickler.singles:
        if storage == addr and lo >= HEADER_BYTES:
            entries[index] = ("T", code, shape, strides, lo // _ITEMSIZE[code], _flags(t, code))
            continue
        # A copy of its own: dense layouts keep their strides, others turn contiguous;
        # ``copy_`` resolves the conjugate and negative bits.
        dst = arena.alloc(nbytes)
        if dst is None:
            return None
        typed = dst.view(t.dtype)
        if _is_contiguous(shape, strides):
            typed.view(shape).copy_(t)
        else:
            if not _is_dense(shape, strides):
                strides = _contiguous_strides(shape)
            torch.as_strided(typed, shape, strides).copy_(t)
        off = (dst.data_ptr() - addr) // _ITEMSIZE[code]
        entries[index] = ("T", code, shape, strides, off, 0)
    for span in pickler.spans:
        lo = span[0][0]
        if span[0][2] == addr and lo >= HEADER_BYTES:
            base = 0
        else:
            # One copy of the storage bytes the aliased tensors cover, as they are. Tensors
            # may view storages that share a data pointer: take the largest.
            start = lo - lo % _MAX_ITEMSIZE
            end = max(p[1] for p in span)
            dst = arena.alloc(end - start)
            if dst is None:
                return None
            source = max((p[5].untyped_storage() for p in span), key=lambda s: s.nbytes())
            dst.copy_(torch.empty(0, dtype=torch.uint8).set_(source)[start:end])
            base = dst.data_ptr() - addr - start
        for lo, _, _, _, index, t, code, shape, strides in span:
            off = (base + lo) // _ITEMSIZE[code]
            entries[index] = ("T", code, shape, strides, off, _flags(t, code))
    for index, a in pickler.arrays:
        dst = arena.alloc(a.nbytes)
        if dst is None:
            return None
        if a.nbytes:
            dst.numpy().view(a.dtype).reshape(a.shape)[...] = a
        entries[index] = ("N", dst.data_ptr() - addr, a.dtype, a.shape)
    return entries


class EncodedBatch:
    """What a worker sends for one batch: the header bytes and the slot holding the data."""

    __slots__ = ("fallback", "payload", "slot")

    def __init__(self, payload: bytes, slot: str | None, fallback: bool) -> None:
        self.payload = payload
        self.slot = slot
        self.fallback = fallback


def encode(batch: Any, arena: Arena) -> EncodedBatch:
    """Place ``batch``'s tensors and arrays in a slot and pickle the rest into a header.

    The arena's current slot may already hold tensors that collation wrote in place. When the
    batch does not fit, a larger slot is taken and everything is placed again; when the
    worker's slot budget forbids that, the batch is pickled whole (the ordinary path).
    """
    buf = io.BytesIO()
    pickler = _LeafPickler(buf)
    pickler.dump(batch)
    header = buf.getvalue()
    if not pickler.leaves:
        arena.current = None  # nothing in the slot: leave it free for the next batch
        return EncodedBatch(header, None, False)
    pickler.plan()
    entries = _place(pickler, arena)
    if entries is None:
        full = arena.current
        taken = arena.reserve(pickler.needed)
        if taken and full is not None and arena.current is full:
            # The same slot came back: big enough for the batch, but not for what collation
            # left in it too, and placing again from its start could overwrite tensors
            # collation wrote there. Take a larger one (and keep it for the next batches).
            taken = arena.reserve(full.size)
        if taken:
            entries = _place(pickler, arena)
        if entries is None:
            arena.current = None
            return EncodedBatch(pickle.dumps(batch, protocol=_PROTOCOL), None, True)
    table = pickle.dumps(entries, protocol=_PROTOCOL)
    return EncodedBatch(table + header, arena.seal(), False)


class _ViewUnpickler(pickle.Unpickler):
    def __init__(self, buf: io.BytesIO, owner: np.ndarray, table: list[Any]) -> None:
        super().__init__(buf)
        self.owner = owner
        self.table = table
        self.objects: list[Any] = [None] * len(table)  # leaves built so far, by index
        self.base: torch.Tensor | None = None
        self.typed: dict[int, torch.Tensor] = {}  # the whole slot viewed as each dtype

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_nested_tensor":
            return self._rebuild_nested_tensor
        return super().find_class(module, name)

    def _rebuild_nested_tensor(
        self, buffer: torch.Tensor, sizes: Any, strides: Any, offsets: Any
    ) -> torch.Tensor:
        """A (strided) nested tensor viewing the slot. torch's rebuild takes the components'
        offsets from the start of the buffer's storage, so the buffer, a view into the slot,
        is given a storage of its own that starts where it does (the bytes are not copied)."""
        if buffer.storage_offset():
            if buffer.is_contiguous() and buffer.numel():
                start = buffer.data_ptr() - self.owner.ctypes.data
                nbytes = buffer.numel() * buffer.element_size()
                buffer = torch.from_numpy(self.owner[start : start + nbytes]).view(buffer.dtype)
            else:
                buffer = buffer.clone()
        return torch._nested_view_from_buffer(buffer, sizes, strides, offsets)

    def persistent_load(self, pid: Any) -> Any:
        obj = self.objects[pid]
        if obj is not None:
            return obj  # the same object again
        entry = self.table[pid]
        kind = entry[0]
        if kind == "T":
            _, code, shape, strides, off, flags = entry
            typed = self.typed.get(code)
            if typed is None:
                if self.base is None:
                    self.base = torch.from_numpy(self.owner)
                # One storage for all dtypes: views alias as they did in the worker.
                typed = self.typed[code] = self.base.view(_DTYPES[code])
            obj = torch.as_strided(typed, shape, strides, off)
            if flags:
                if flags & _CONJ:
                    obj = obj.conj()
                if flags & _NEG:
                    obj = torch._neg_view(obj)
        elif kind == "N":
            _, off, dtype, shape = entry
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            obj = self.owner[off : off + nbytes].view(dtype).reshape(shape)
        else:
            raise pickle.UnpicklingError(f"unknown table entry kind {kind!r}")
        self.objects[pid] = obj
        return obj


def decode(payload: bytes, slot: str | None, slots: SlotMap | None, buf: Any = None) -> Any:
    """Rebuild a batch; its tensors view the slot, which is freed when the last view dies.

    ``buf``: the slot's mapping, if the caller opened it already (``slots.open(slot)``);
    required when ``slots`` is None.
    """
    if slot is None:
        return pickle.loads(payload)
    if buf is None:
        if slots is None:
            raise ValueError(f"slot {slot!r} needs a SlotMap or its mapping to decode")
        buf = slots.open(slot)
    owner = np.frombuffer(buf, dtype=np.uint8)
    finalizer = weakref.finalize(owner, release, buf)
    finalizer.atexit = False
    stream = io.BytesIO(payload)
    table = pickle.load(stream)
    unpickler = _ViewUnpickler(stream, owner, table)
    del owner
    return unpickler.load()
