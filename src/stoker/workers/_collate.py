"""Make torch's ``default_collate`` stack tensors straight into the current slot.

torch's collate, inside a worker, stacks every batch into a brand-new shared-memory segment
that the kernel must zero and fault in. A stoker worker replaces the ``torch.Tensor`` entry of
``default_collate_fn_map`` in its own process with :func:`collate_tensor_into_slot`, so the
default collate, and every user ``collate_fn`` that calls it, writes into a reused slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data._utils import collate as _torch_collate

from stoker.transport._codec import Arena

__all__ = ["install"]

_arena: Arena | None = None


def collate_tensor_into_slot(
    batch: list[torch.Tensor],
    *,
    collate_fn_map: dict[type | tuple[type, ...], Callable[..., Any]] | None = None,
) -> torch.Tensor:
    elem = batch[0]
    if elem.is_nested or elem.layout != torch.strided:
        # Same errors as torch for nested and sparse tensors.
        return _torch_collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    out = None
    arena = _arena
    if arena is not None and elem.device.type == "cpu":
        shape = (len(batch), *elem.shape)
        numel = len(batch) * elem.numel()
        raw = arena.alloc(numel * elem.element_size())
        if raw is not None:
            out = raw.view(elem.dtype).view(shape)
    return torch.stack(batch, 0, out=out)


def install(arena: Arena | None) -> None:
    """Route ``default_collate``'s tensor stacking in this process into ``arena``.

    With ``arena=None`` (thread workers) tensors are stacked into ordinary memory, as torch
    does in the main process, instead of the fresh shared-memory segment torch's collate
    would allocate for each batch of a thread that ``get_worker_info()`` calls a worker. A
    user's own replacement of the ``torch.Tensor`` entry is left alone.
    """
    global _arena
    _arena = arena
    table = _torch_collate.default_collate_fn_map
    if table.get(torch.Tensor) in (_torch_collate.collate_tensor_fn, collate_tensor_into_slot):
        table[torch.Tensor] = collate_tensor_into_slot
