"""Peak PSS of the process tree on the bench's memory workload (3M Python paths).

Run one configuration per process (each builds the dataset afresh)::

    for c in torch-nw0 torch-nw2 stoker-process stoker-thread \\
             stoker-process-compact torch-nw0-compact; do
        python benchmarks/memory_pss.py $c
    done
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

import torch
from _common import endless_sampler

import stoker
from stoker.bench._measure import Meter, TreeMeter
from stoker.bench._synthetic import PathsDataset

READS = 400_000


class CompactPaths(PathsDataset):
    """The same paths, held by ``stoker.compact``."""

    def __init__(self, n: int = 3_000_000) -> None:
        super().__init__(n)
        self.paths = stoker.compact(self.paths)  # type: ignore[assignment]


def peak_pss(loader: Any) -> tuple[int, float]:
    baseline = TreeMeter.children_now()
    it = iter(loader)
    next(it)
    with Meter(baseline) as meter:
        seen = 0
        t0 = time.perf_counter()
        while seen < READS:
            seen += len(next(it)[0])
        rate = seen / (time.perf_counter() - t0)
    del it
    gc.collect()
    assert meter.usage is not None
    return meter.usage.peak_pss_bytes, rate


if __name__ == "__main__":
    which = sys.argv[1]
    ds = CompactPaths() if which.endswith("compact") else PathsDataset()
    kw: dict[str, Any] = {"batch_size": 256, "sampler": endless_sampler(ds)}
    loaders = {
        "torch-nw0": lambda: torch.utils.data.DataLoader(ds, **kw),
        "torch-nw0-compact": lambda: torch.utils.data.DataLoader(ds, **kw),
        "torch-nw2": lambda: torch.utils.data.DataLoader(
            ds, num_workers=2, persistent_workers=True, **kw
        ),
        "stoker-process": lambda: stoker.DataLoader(ds, num_workers=2, **kw),
        "stoker-process-compact": lambda: stoker.DataLoader(ds, num_workers=2, **kw),
        "stoker-thread": lambda: stoker.DataLoader(ds, num_workers=2, backend="thread", **kw),
    }
    pss, rate = peak_pss(loaders[which]())
    print(f"{which}: peak tree PSS {pss / 2**20:,.0f} MiB, {rate:,.0f} samples/s")
