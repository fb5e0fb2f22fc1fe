"""What stoker's iterators share with torch's: ``__next__`` without a profiler range when no
profiler runs.

torch's ``__next__`` opens a ``record_function`` range around every batch. Entering and
leaving it calls two torch operators that give the GIL up and take it back: with thread
workers loading beside the loop, the loop's thread then waits for the GIL twice per batch
(32 thread workers on a dataset that sleeps 5 ms per sample, batch 32: the two calls took
30% of the main thread's CPU per batch, measured with ``cProfile`` on the thread's clock).
stoker keeps torch's range, so a trace under ``torch.profiler`` still shows the loader's
``enumerate(DataLoader)`` spans, and leaves it out when no profiler is running.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import dataloader as _torch_dl

__all__ = ["StokerIterBase"]

# torch's own check (a C call, 0.04 us here); a torch without it keeps the range always.
_profiler_enabled = getattr(torch.autograd, "_profiler_enabled", lambda: True)


class StokerIterBase(_torch_dl._BaseDataLoaderIter):
    """torch's iterator base with ``__next__`` skipping the profiler range when unobserved."""

    def __next__(self) -> Any:
        if (
            _profiler_enabled()
            or self._sampler_iter is None  # torch's lazy reset: rare, its own path
            or self._IterableDataset_len_called is not None  # torch warns on a short __len__
        ):
            return super().__next__()
        data: Any = self._next_data()
        self._num_yielded += 1
        return data
