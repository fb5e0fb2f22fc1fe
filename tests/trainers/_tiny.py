"""A tiny regression problem shared by the trainer tests (module level: workers pickle it)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

# Samples of the tiny dataset; the trainers run a few steps of batches of BATCH.
SAMPLES = 32
BATCH = 4


class TinyDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``(x, 2x + 1)`` for ``x`` in ``0 .. SAMPLES-1`` (scaled), as float tensors of shape (1,)."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor([index / SAMPLES])
        return x, 2 * x + 1
