"""``stoker.watch`` on the bench's tiny workload: the same loader with and without it.

Run: ``python benchmarks/watch_overhead.py``
"""

from __future__ import annotations

import statistics

from _common import endless_sampler, rate

import stoker
from stoker.bench._synthetic import TinyDataset

REPEATS = 10
SECONDS = 2.0

if __name__ == "__main__":
    ds = TinyDataset()
    loader = stoker.DataLoader(ds, batch_size=256, sampler=endless_sampler(ds), num_workers=2)
    plain, watched = [], []
    for _ in range(REPEATS):
        plain.append(rate(lambda: loader, SECONDS, warmup=20))
        watched.append(rate(lambda: stoker.watch(loader, every=100, progress=False), SECONDS, 20))
    p, w = statistics.median(plain), statistics.median(watched)
    print(f"plain {p:,.0f} samples/s, watched {w:,.0f} samples/s, difference {1 - w / p:.1%}")
    print("plain runs:  ", [round(x) for x in plain])
    print("watched runs:", [round(x) for x in watched])
