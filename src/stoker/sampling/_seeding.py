"""Per-batch seeds: a pure function of (epoch seed, batch index), never of the worker.

Reseeding ``torch``, ``random`` and ``numpy`` before each batch makes random augmentations in
``__getitem__`` repeat run to run for a given generator seed, whatever ``num_workers`` is and
whichever worker fetched the batch.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import random
from typing import Any

import numpy as np

# numpy loads its random module on first use (6 ms): imported with stoker, as the engine is
# (stoker.loader._loader), not in the first batch the main process loads for
# num_workers="auto" (large's came 4-6 ms later than torch's num_workers=0 for it), nor in
# each forked worker at its first seeding (26-28 ms of its start, and private pages).
import numpy.random
import torch

__all__ = [
    "CallerRandomState",
    "WorkerSeeding",
    "batch_seed",
    "draw_base_seed",
    "epoch_seed",
    "seed_all",
]

# numpy's MT19937 state struct: uint32_t key[624]; int pos (numpy/random/src/mt19937).
_MT_STATE_BYTES = 624 * 4 + 4

_MASK64 = (1 << 64) - 1
# Position of a Mersenne Twister (``random``'s, numpy's legacy one) right after seeding: its
# whole key unused. A state that changed and sits there was reseeded, not drawn from.
_MT_FRESH_POS = 624


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


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _random_base() -> int | None:
    """A seed standing for ``random``'s state if it was just seeded, else None."""
    _, key, _ = random.getstate()
    return _digest(array.array("Q", key).tobytes()) if key[-1] == _MT_FRESH_POS else None


def _numpy_base() -> int | None:
    """A seed standing for numpy's legacy global state if it was just seeded, else None."""
    state: Any = np.random.get_state()
    if state[0] != "MT19937" or state[2] != _MT_FRESH_POS:
        return None
    return _digest(np.ascontiguousarray(state[1]).tobytes())


def _seed_torch_reporting(seed: int, reported: int) -> None:
    """Seed torch's CPU generator with ``seed`` while ``torch.initial_seed()`` reports
    ``reported``: the generator's state starts with its initial seed (the layout torch keeps
    for saved states), so the stream is ``seed``'s and the reported seed the user's."""
    generator = torch.default_generator
    generator.manual_seed(seed)
    state = generator.get_state()
    patched = state.clone()
    patched[:8] = torch.tensor(list((reported & _MASK64).to_bytes(8, "little")), dtype=torch.uint8)
    generator.set_state(patched)
    if generator.initial_seed() != reported & _MASK64 or not torch.equal(
        generator.get_state()[8:], state[8:]
    ):  # another layout: the stream matters more than the reported seed
        generator.set_state(state)


class WorkerSeeding:
    """How a worker seeds ``torch``, ``random`` and numpy's legacy global generator.

    The worker starts seeded with its seed, as in torch (``seed_all``). Before each batch,
    every generator is seeded from the batch's seed (the loader's base seed, the epoch and
    the batch index), so draws in ``__getitem__`` are the same for any ``num_workers``.

    A generator that ``worker_init_fn`` reseeded is the user's instead: ``torch`` when
    ``torch.initial_seed()`` differs afterwards from the worker's seed; ``random`` or numpy
    when its state changed and is freshly seeded (a draw alone, as in a shuffle of shards,
    leaves it to stoker). Such a generator is seeded before each batch from what it was
    seeded with, the epoch and the batch index: still the same for any ``num_workers`` and
    independent of the loader's seed, as a fixed seed asks, without every worker repeating
    the same draws; ``torch.initial_seed()`` in ``__getitem__`` returns the seed it set.

    Args:
        worker_seed: the worker's seed (``get_worker_info().seed``).
    """

    def __init__(self, worker_seed: int) -> None:
        self._worker_seed = int(worker_seed)
        seed_all(self._worker_seed)
        self._seeded_random = random.getstate()
        self._seeded_numpy = np.random.get_state()
        self._torch: int | None = None  # the user's seeds; None: stoker's
        self._random: int | None = None
        self._numpy: int | None = None

    def adopt(self) -> None:
        """Take over the seeds ``worker_init_fn`` set (call right after it)."""
        seed = torch.initial_seed()
        self._torch = seed if seed != self._worker_seed else None
        if random.getstate() != self._seeded_random:
            self._random = _random_base()
        now = np.random.get_state()
        if any(_differs(a, b) for a, b in zip(now, self._seeded_numpy, strict=True)):
            self._numpy = _numpy_base()

    def before_batch(self, seed: int, epoch: int, batch: int) -> None:
        """Seed the generators for batch ``batch`` of ``epoch``, whose seed is ``seed``."""

        if self._torch is None and self._random is None and self._numpy is None:
            seed_all(seed)  # the common case: every generator is stoker's
            return

        def own(base: int | None) -> int:
            return seed if base is None else batch_seed(epoch_seed(base, epoch), batch)

        if self._torch is None:
            torch.default_generator.manual_seed(seed)
        else:
            _seed_torch_reporting(own(self._torch), self._torch)
        random.seed(own(self._random))
        np.random.seed(own(self._numpy) & 0xFFFF_FFFF)


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return not np.array_equal(a, b)
    return bool(a != b)


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
