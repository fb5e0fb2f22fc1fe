"""Datasets for the tune tests (importable by `module:factory`)."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset


class Squares(Dataset):
    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i * i))


class Sleepy(Dataset):
    """Samples that sleep 9 ms and compute about 1 ms: workers are blocked most of the time."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.009)
        end = time.thread_time() + 0.001
        while time.thread_time() < end:
            pass
        return torch.full((4,), float(i))


class Busy(Dataset):
    """Samples that compute about 1 ms in Python (holding the GIL): CPU work for processes."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.thread_time() + 0.001
        while time.thread_time() < end:
            pass
        return torch.full((4,), float(i))


def make_dataset() -> Squares:
    return Squares()
