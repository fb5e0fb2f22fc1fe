"""Datasets for the tune tests (importable by `module:factory`)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class Squares(Dataset):
    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i * i))


def make_dataset() -> Squares:
    return Squares()
