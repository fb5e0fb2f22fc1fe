"""The machine's ceiling for a workload: forked processes loading its batches with no loader.

Each of ``--procs`` processes (forked, one OpenMP thread) loads and collates whole batches of
the workload (random indices, seeded per process) and reports only a count: no transport, no
sampler, no reordering, no controller. Its samples/s is what any loader can reach on this
machine's cores; the contenders named after the workload run in the same invocation,
alternating with it, read the same way (``rate`` of ``_common``, after ``--settle`` seconds).
Printed: samples/s, the median of the rounds and each round's.

Run: ``python benchmarks/ceiling.py heavytail auto process:10 spdl16 --procs 10``
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

import torch
from _common import contender, contenders_parser, endless_sampler, open_workload, rate


def _load(dataset: Any, batch_size: int, seed: int, conn: Connection) -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    n = len(dataset)
    while not conn.poll():
        index = torch.randint(n, (batch_size,), generator=gen).tolist()
        torch.utils.data.default_collate([dataset[i] for i in index])
        conn.send(batch_size)


def pool_rate(dataset: Any, batch_size: int, procs: int, settle: float, seconds: float) -> float:
    """Samples/s of ``procs`` forked processes loading batches side by side."""
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(procs)]
    workers = [
        ctx.Process(target=_load, args=(dataset, batch_size, seed, child), daemon=True)
        for seed, (_, child) in enumerate(pipes)
    ]
    for w in workers:
        w.start()
    try:
        end = time.perf_counter() + settle
        samples, t0 = 0, 0.0
        while True:
            for parent, _ in pipes:
                while parent.poll():
                    got = parent.recv()
                    samples += got if t0 else 0
            now = time.perf_counter()
            if not t0 and now >= end:
                t0, samples = now, 0
            if t0 and now - t0 >= seconds:
                return samples / (now - t0)
            time.sleep(0.005)
    finally:
        for parent, _ in pipes:
            parent.send(None)
        for w in workers:
            w.join(5)
            if w.is_alive():
                w.kill()
                w.join()


def main() -> None:
    parser = contenders_parser(__doc__ or "")
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    workload, dataset = open_workload(args.workload)
    size = workload.batch_size
    names = [f"pool:{args.procs}", *args.contenders]
    rates: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            if name == names[0]:
                r = pool_rate(dataset, size, args.procs, args.settle, args.seconds)
            else:
                make = functools.partial(contender, name, dataset, size, endless_sampler(dataset))
                r = rate(make, args.seconds, settle=args.settle)
            rates[name].append(r)
    print(f"{args.workload}, {args.rounds} rounds, {os.cpu_count()} cores")
    for name in names:
        runs = " ".join(f"{r:,.0f}" for r in rates[name])
        print(f"  {name:16s} {statistics.median(rates[name]):9,.0f} samples/s  runs {runs}")


if __name__ == "__main__":
    main()
