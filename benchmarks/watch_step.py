"""Per-step cost of ``stoker.watch`` on a trivial iterable of batches.

Run: ``python benchmarks/watch_step.py``
"""

from __future__ import annotations

import time

import torch

import stoker

STEPS = 200_000


def per_step_us(iterable: object) -> float:
    t0 = time.perf_counter()
    for _batch in iterable:  # type: ignore[attr-defined]
        pass
    return (time.perf_counter() - t0) / STEPS * 1e6


if __name__ == "__main__":
    source = [torch.zeros(256, 64, dtype=torch.int64)] * STEPS
    bare = min(per_step_us(iter(source)) for _ in range(3))
    watched = min(per_step_us(stoker.watch(source, every=100, progress=False)) for _ in range(3))
    print(
        f"per step: bare {bare:.2f} us, watched {watched:.2f} us, overhead {watched - bare:.2f} us"
    )
