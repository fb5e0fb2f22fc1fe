"""Per-batch seeds: a pure function of (epoch seed, batch index), never of the worker.

Reseeding ``torch``, ``random`` and ``numpy`` before each batch makes random augmentations in
``__getitem__`` repeat run to run for a given generator seed, whatever ``num_workers`` is and
whichever worker fetched the batch.
"""

from __future__ import annotations

import ctypes
import random
from typing import Any

import numpy as np
import torch

__all__ = ["CallerRandomState", "batch_seed", "draw_base_seed", "epoch_seed", "seed_all"]

# numpy's MT19937 state struct: uint32_t key[624]; int pos (numpy/random/src/mt19937).
_MT_STATE_BYTES = 624 * 4 + 4

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


class CallerRandomState:
    """Saves and restores the caller's global random states (``torch``, ``random``, numpy's
    legacy generator) around batches loaded in the main process.

    numpy's ``get_state``/``set_state`` cost about 35 us each (they copy the 624-word key one
    element at a time): 13-20% of a cheap batch. So the numpy state last saved is kept, with a
    copy of its raw key and position, while its Gaussian cache is empty. Then, if the raw
    state still matches, nothing moved it and ``save`` skips ``get_state``. ``restore`` empties
    the cache (``np.random.seed``) and copies the raw state back.

    A cached Gaussian changes only with a draw (which moves the key or position) or when one
    is taken from the cache, and the shortcut is used only while the cache was empty. So the
    restored state is always exactly the saved one. Any other generator behind
    ``np.random`` (``set_bit_generator``) takes the full path.
    """

    def __init__(self) -> None:
        self._bit_generator: Any = None
        self._raw: Any = None  # a view of the global MT19937's state struct
        self._kept: tuple[Any, bytes] | None = None  # (legacy state, its raw bytes)

    def _view(self) -> Any:
        bit_generator = getattr(getattr(np.random, "mtrand", None), "_rand", None)
        bit_generator = getattr(bit_generator, "_bit_generator", None)
        if bit_generator is not self._bit_generator:
            self._bit_generator, self._raw, self._kept = bit_generator, None, None
            if isinstance(bit_generator, np.random.MT19937):
                address = bit_generator.ctypes.state_address
                self._raw = (ctypes.c_char * _MT_STATE_BYTES).from_address(address)
        return self._raw

    def save(self) -> tuple[Any, Any, Any]:
        """The caller's states, for :meth:`restore` (numpy's is None when unchanged)."""
        saved_np: Any = None
        raw = self._view()
        kept = self._kept
        if raw is None or kept is None or raw.raw != kept[1]:
            saved_np = np.random.get_state()  # the legacy tuple
            empty_cache = saved_np[3] == 0  # legacy tuple: (name, key, pos, has_gauss, gauss)
            self._kept = (saved_np, raw.raw) if raw is not None and empty_cache else None
        return torch.get_rng_state(), random.getstate(), saved_np

    def restore(self, saved: tuple[Any, Any, Any]) -> None:
        """Put back the states :meth:`save` returned."""
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        kept, raw = self._kept, self._raw
        if kept is not None and raw is not None and (saved[2] is None or saved[2] is kept[0]):
            np.random.seed(0)  # empties the Gaussian cache (the saved one was empty)
            ctypes.memmove(raw, kept[1], _MT_STATE_BYTES)
        else:
            np.random.set_state(saved[2])
