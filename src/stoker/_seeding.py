"""Per-batch seeds: a pure function of (epoch seed, batch index), never of the worker.

Reseeding ``torch``, ``random`` and ``numpy`` before each batch makes random augmentations in
``__getitem__`` repeat run to run for a given generator seed, whatever ``num_workers`` is and
whichever worker fetched the batch.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["batch_seed", "seed_all"]

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def batch_seed(epoch_seed: int, batch_index: int) -> int:
    """A well-mixed 63-bit seed for one batch of one epoch."""
    return _splitmix64(_splitmix64(epoch_seed & _MASK64) ^ batch_index) >> 1


def seed_all(seed: int) -> None:
    """Seed torch's CPU generator, ``random`` and numpy's legacy global generator."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFF_FFFF)
