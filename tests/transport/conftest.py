"""Fixtures of the transport tests: real shared-memory slot arenas, removed after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from _codec_support import new_prefix
from torch.utils.data._utils import collate as torch_collate

from stoker.transport import SlotArena, SlotMap, unlink_owned
from stoker.workers import _collate


@pytest.fixture
def pool() -> Iterator[tuple[SlotArena, SlotMap]]:
    """An arena (64 MiB of slots) and the map that opens its slots."""
    prefix = new_prefix()
    arena = SlotArena(prefix, 0, budget_bytes=64 << 20)
    slots = SlotMap()
    yield arena, slots
    arena.close()
    slots.clear()
    unlink_owned(prefix)


@pytest.fixture
def tight_arena() -> Iterator[SlotArena]:
    """An arena whose slots may hold 2 MiB in all."""
    prefix = new_prefix()
    arena = SlotArena(prefix, 0, budget_bytes=2 << 20)
    yield arena
    arena.close()
    unlink_owned(prefix)


@pytest.fixture
def collate_into_slots(
    pool: tuple[SlotArena, SlotMap],
) -> Iterator[tuple[SlotArena, SlotMap]]:
    """``pool``, with torch's default collate writing tensors into its slots (as in a worker)."""
    saved = torch_collate.default_collate_fn_map[torch.Tensor]
    _collate.install(pool[0])
    yield pool
    torch_collate.default_collate_fn_map[torch.Tensor] = saved
    _collate._arena = None
