"""``num_workers="auto"`` against a fixed 2 workers on large and jpeg, alternating runs.

Run: ``python benchmarks/auto_backend.py``
"""

from __future__ import annotations

import statistics

from _common import endless_sampler, rate

import stoker
from stoker.bench._jpeg import _jpeg
from stoker.bench._synthetic import LargeDataset

REPEATS = 3
SECONDS = 4.0

if __name__ == "__main__":
    for name, ds in (("large", LargeDataset()), ("jpeg", _jpeg(True))):
        fixed, auto = [], []
        for _ in range(REPEATS):
            fixed.append(
                rate(
                    lambda ds=ds: stoker.DataLoader(
                        ds, batch_size=64, sampler=endless_sampler(ds), num_workers=2
                    ),
                    SECONDS,
                )
            )
            auto.append(
                rate(
                    lambda ds=ds: stoker.DataLoader(
                        ds, batch_size=64, sampler=endless_sampler(ds), num_workers="auto"
                    ),
                    SECONDS,
                )
            )
        print(
            f"{name}: stoker nw=2 {statistics.median(fixed):,.0f} samples/s, "
            f"num_workers=auto {statistics.median(auto):,.0f} samples/s"
        )
