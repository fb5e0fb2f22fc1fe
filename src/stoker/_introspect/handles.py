"""Open handles that break or misbehave in a forked worker (h5py, lmdb, sqlite3, sockets,
files), recognised without importing the libraries that make them.

Shared by the loader (the error for an unpicklable dataset) and ``stoker doctor`` (SK104).
"""

from __future__ import annotations

import io
import socket
import sqlite3
import sys
from typing import Any, NamedTuple

__all__ = ["HandleKind", "handle_kind"]


class HandleKind(NamedTuple):
    """What a handle is, and whether a forked worker's copy breaks (else it only shares an
    offset or a connection with the parent's)."""

    description: str
    breaks: bool


def handle_kind(obj: Any) -> HandleKind | None:
    """What kind of fork-unsafe handle ``obj`` is, or None."""
    h5py = sys.modules.get("h5py")
    if h5py is not None and isinstance(obj, (h5py.File, h5py.Dataset, h5py.Group)) and obj:
        return HandleKind(f"an open h5py.{type(obj).__name__}", True)
    lmdb = sys.modules.get("lmdb")
    if lmdb is not None and isinstance(obj, (lmdb.Environment, lmdb.Transaction)):
        return HandleKind(f"an open lmdb.{type(obj).__name__}", True)
    if isinstance(obj, sqlite3.Connection):
        return HandleKind("an open sqlite3 connection", True)
    if isinstance(obj, socket.socket) and obj.fileno() >= 0:
        return HandleKind("an open socket", False)
    if isinstance(obj, io.IOBase) and not obj.closed:
        return HandleKind(f"an open file ({getattr(obj, 'name', '?')})", False)
    return None
