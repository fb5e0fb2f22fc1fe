"""``num_workers="auto"`` against a fixed 2 workers on large and jpeg, alternating runs.

Run: ``python benchmarks/auto_backend.py``
"""

from __future__ import annotations

import functools
import statistics
from typing import Any, Literal

from _common import endless_sampler, rate

import stoker
from stoker.bench._jpeg import _jpeg
from stoker.bench._synthetic import LargeDataset

REPEATS = 3
SECONDS = 4.0


def _loader(dataset: Any, workers: int | Literal["auto"]) -> Any:
    return stoker.DataLoader(
        dataset, batch_size=64, sampler=endless_sampler(dataset), num_workers=workers
    )


if __name__ == "__main__":
    for name, ds in (("large", LargeDataset()), ("jpeg", _jpeg(True))):
        fixed, auto = [], []
        for _ in range(REPEATS):
            fixed.append(rate(functools.partial(_loader, ds, 2), SECONDS))
            auto.append(rate(functools.partial(_loader, ds, "auto"), SECONDS))
        print(
            f"{name}: stoker nw=2 {statistics.median(fixed):,.0f} samples/s, "
            f"num_workers=auto {statistics.median(auto):,.0f} samples/s"
        )
