"""Flat, array-backed sequences that forked workers can read without copying them.

A Python list of a million paths is a million objects; every read in a forked worker writes
the object's reference count, so the page holding it is copied into that worker, and the
dataset ends up copied once per worker (copy-on-read). :func:`compact` stores the same values
in a few numpy buffers (bytes + offsets, or one integer array), whose pages are only read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, overload

import numpy as np

__all__ = ["CompactSequence", "compact"]

_Kind = Literal["str", "bytes", "int"]


class _Column:
    """One column of values of one kind, stored flat."""

    __slots__ = ("data", "kind", "offsets")

    def __init__(self, values: Sequence[Any], kind: _Kind) -> None:
        self.kind = kind
        if kind == "int":
            self.data = np.asarray(values, dtype=np.int64)
            self.offsets = None
            return
        encoded = [v.encode("utf-8") if kind == "str" else bytes(v) for v in values]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        total = int(lengths.sum())
        offsets = np.zeros(len(encoded) + 1, dtype=np.uint32 if total < 2**32 else np.int64)
        np.cumsum(lengths, out=offsets[1:])
        self.offsets = offsets
        self.data = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()

    def get(self, i: int) -> Any:
        if self.kind == "int":
            return int(self.data[i])
        assert self.offsets is not None
        raw = self.data[int(self.offsets[i]) : int(self.offsets[i + 1])].tobytes()
        return raw.decode("utf-8") if self.kind == "str" else raw

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + (self.offsets.nbytes if self.offsets is not None else 0))


def _kind_of(value: Any, where: str) -> _Kind:
    if isinstance(value, str):
        return "str"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return "int"
    raise TypeError(
        f"`compact` stores str, bytes and int values (or tuples of them); {where} is a "
        f"{type(value).__name__}: {value!r:.80}. Convert it first, or keep this column out."
    )


class CompactSequence(Sequence[Any]):
    """A read-only sequence of values (or tuples of values) held in flat numpy buffers.

    Built by :func:`compact`; indexing returns the original Python values.
    """

    def __init__(self, columns: list[_Column], tuples: bool, length: int) -> None:
        self._columns = columns
        self._tuples = tuples
        self._len = length

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"indices must be integers or slices, not {type(i).__name__}")
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"index {i} out of range for a CompactSequence of {self._len}")
        if self._tuples:
            return tuple(c.get(i) for c in self._columns)
        return self._columns[0].get(i)

    def __iter__(self) -> Iterator[Any]:
        for i in range(self._len):
            yield self[i]

    @property
    def nbytes(self) -> int:
        """Bytes held in the buffers."""
        return sum(c.nbytes for c in self._columns)

    def __repr__(self) -> str:
        return f"CompactSequence(len={self._len}, nbytes={self.nbytes})"


def compact(seq: Sequence[Any]) -> CompactSequence:
    """Store a list of str, bytes or int (or of tuples of them) in flat numpy buffers.

    Use it for the big lists a dataset holds (file paths, labels, captions) so that forked
    workers stop copying them: ``self.samples = stoker.compact(self.samples)``.

    Args:
        seq: the values; every element of one kind, or every element a tuple of the same
            length whose positions each hold one kind (``[("a.jpg", 3), ...]``).

    Returns:
        A read-only :class:`CompactSequence` that indexes like ``seq``.

    Raises:
        TypeError: an element (or tuple position) is of another type, or of mixed kinds.
    """
    values = list(seq)
    n = len(values)
    if n == 0:
        return CompactSequence([_Column([], "int")], False, 0)
    tuples = isinstance(values[0], tuple)
    if tuples:
        width = len(values[0])
        rows: list[list[Any]] = [[] for _ in range(width)]
        for k, row in enumerate(values):
            if not isinstance(row, tuple) or len(row) != width:
                raise TypeError(
                    f"`compact` needs every element to be a tuple of {width} values like the "
                    f"first; element {k} is {row!r:.80}."
                )
            for c, v in enumerate(row):
                rows[c].append(v)
        cols = rows
    else:
        cols = [values]
    columns = []
    for c, col in enumerate(cols):
        kind = _kind_of(col[0], f"element 0{f' position {c}' if tuples else ''}")
        for k, v in enumerate(col):
            if _kind_of(v, f"element {k}{f' position {c}' if tuples else ''}") != kind:
                raise TypeError(
                    f"`compact` needs one kind per column; element {k}"
                    f"{f' position {c}' if tuples else ''} is {type(v).__name__}, "
                    f"element 0 is {kind}."
                )
        columns.append(_Column(col, kind))
    return CompactSequence(columns, tuples, n)
