"""A training step's touch of a batch, shared by the commands that time loaders.

``stoker bench`` and ``stoker tune`` both time a loader the same way: every batch is read as a
training step would read it, so the cost of moving the batch is paid alike by every contender.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["PAGE_BYTES", "consume"]

PAGE_BYTES = 4096


def _tensor_leaves(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensor_leaves(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensor_leaves(value)


def consume(batch: Any) -> int:
    """The bench's "training step": touch every batch realistically but cheaply.

    Reads one element per 4 KiB page of every tensor leaf, so page faults and the cost of
    moving the batch are paid by every contender alike, then drops the batch.

    Args:
        batch: a batch as a loader yields it (tensors nested in tuples, lists and dicts).

    Returns:
        The number of samples in the batch (the first dimension of its first tensor leaf,
        1 when it has none).
    """
    samples = 0
    for leaf in _tensor_leaves(batch):
        if not samples:
            samples = int(leaf.shape[0]) if leaf.dim() else 1
        if leaf.numel():
            stride = max(1, PAGE_BYTES // leaf.element_size())
            leaf.reshape(-1)[::stride].sum()
    return samples or 1
