"""Helpers of the transport tests (fixtures are in conftest.py)."""

from __future__ import annotations

import itertools
import os
from typing import Any

import torch

from stoker.transport import SlotArena, SlotMap, decode, encode, slot_prefix
from stoker.transport._slots import HEADER_BYTES

_ids = itertools.count(1_000_000)


def new_prefix() -> str:
    """A slot-file prefix of this process that no other test uses."""
    return slot_prefix(os.getpid(), next(_ids))


def offset_in_slot(arena: SlotArena, tensor: torch.Tensor) -> int | None:
    """Where ``tensor`` lies in the arena's current slot (collation wrote it there), or None
    if it lies elsewhere."""
    slot = arena.current
    if slot is None:
        return None
    off = tensor.data_ptr() - slot.addr
    if off < HEADER_BYTES or off + tensor.nbytes > slot.size:
        return None
    return off


def roundtrip(batch: Any, arena: SlotArena, slots: SlotMap) -> tuple[Any, Any]:
    """Encode ``batch`` into a fresh slot of ``arena`` and decode it: (batch, encoded)."""
    arena.begin()
    enc = encode(batch, arena)
    return decode(enc.payload, enc.slot, slots), enc
