"""What ``iter(loader)`` returns when the workers persist: the epoch, as the loop holds it.

torch keeps a loader's persistent iterator for the loader's life and hands the same object
out at every ``iter()``, so a loop that leaves an epoch early (``break`` at a step limit,
``next(iter(loader))`` to look at one batch) does not let go of anything the loader can see:
the workers would go on loading the prefetched batches of the abandoned epoch until the next
``iter()``, competing with whatever the loop does next, an evaluation for instance
(``benchmarks/after_break.py`` measures the CPU they use).

:class:`EpochHandle` is a thin view of the persistent iterator for one epoch. The loop holds
it; when the loop drops it before the epoch's end, the iterator takes back the tasks no worker
has started (see :meth:`stoker.loader._iterator.MultiWorkerIterator.let_go`): the workers finish the
batch they are on and go idle. Nothing delivered changes: a handle still held can be iterated
on (the tasks are dispatched again), the loader's ``state_dict`` still describes the epoch
where the loop left it, and the next ``iter()`` starts a new epoch as before.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["EpochHandle"]


class EpochHandle:
    """One epoch of a loader's persistent iterator (see the module docstring).

    Iterating it iterates the iterator; any other attribute is the iterator's (read, set or
    deleted there).

    Args:
        iterator: the loader's persistent :class:`stoker.loader._iterator.MultiWorkerIterator`,
            just reset for a new epoch.
    """

    __slots__ = ("_generation", "_iterator")

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self._generation: int = iterator._generation

    def __iter__(self) -> EpochHandle:
        return self

    def __next__(self) -> Any:
        return self._iterator.__next__()

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        if name in EpochHandle.__slots__:  # not set yet (a failed __init__)
            raise AttributeError(name)
        return getattr(self._iterator, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in EpochHandle.__slots__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._iterator, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._iterator, name)

    def __repr__(self) -> str:
        return f"<stoker epoch of {self._iterator!r}>"

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # also at interpreter exit
            self._iterator.let_go(self._generation)
