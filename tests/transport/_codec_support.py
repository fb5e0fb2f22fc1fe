"""Helpers of the transport tests (fixtures are in conftest.py)."""

from __future__ import annotations

import itertools
import os
from typing import Any

from stoker.transport import SlotArena, SlotMap, decode, encode, slot_prefix

_ids = itertools.count(1_000_000)


def new_prefix() -> str:
    """A slot-file prefix of this process that no other test uses."""
    return slot_prefix(os.getpid(), next(_ids))


def roundtrip(batch: Any, arena: SlotArena, slots: SlotMap) -> tuple[Any, Any]:
    """Encode ``batch`` into a fresh slot of ``arena`` and decode it: (batch, encoded)."""
    arena.begin()
    enc = encode(batch, arena)
    return decode(enc.payload, enc.slot, slots), enc
