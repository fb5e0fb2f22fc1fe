"""Per-batch seeds: a pure function of (epoch seed, batch index), never of the worker.

Reseeding ``torch``, ``random`` and ``numpy`` before each batch makes random augmentations in
``__getitem__`` repeat run to run for a given generator seed, whatever ``num_workers`` is and
whichever worker fetched the batch.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["batch_seed", "draw_base_seed", "epoch_seed", "seed_all"]

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def batch_seed(epoch_seed: int, batch_index: int) -> int:
    """A well-mixed 63-bit seed for one batch of one epoch."""
    return _splitmix64(_splitmix64(epoch_seed & _MASK64) ^ batch_index) >> 1


def epoch_seed(base_seed: int, epoch: int) -> int:
    """The seed of the ``epoch``-th epoch of an iterator whose base seed is ``base_seed``.

    Derived, not drawn: persistent workers' later epochs take nothing from the loader's
    ``generator`` (torch's persistent iterator takes nothing either), so the sampler's order
    and the caller's random stream stay exactly torch's.
    """
    if epoch == 0:
        return int(base_seed)
    return batch_seed(int(base_seed) ^ 0x5EED_E90C_5EED_E90C, epoch)


def draw_base_seed(generator: torch.Generator | None) -> int:
    """An iterator's base seed, drawn as torch's iterators draw theirs."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def seed_all(seed: int) -> None:
    """Seed torch's CPU generator, ``random`` and numpy's legacy global generator."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFF_FFFF)
