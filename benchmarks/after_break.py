"""CPU that a loader burns after the loop leaves an epoch early.

A training loop that ``break``s out of an epoch (a step limit, a validation every N steps)
and then does something else leaves persistent workers with the epoch's prefetched batches.
For each contender, a fresh loader runs ``--epochs`` epochs of ``--seconds`` seconds each on a
bench workload; after each ``break`` the script sleeps ``--idle`` seconds (the loop's "other
work") and prints the CPU seconds the process tree used meanwhile (what the workers took from
that other work). Contenders:

* ``torch``: torch's DataLoader, ``--torch-nw`` workers, ``prefetch_factor=4``, persistent;
* ``auto``: stoker, ``num_workers="auto"``;
* ``BACKEND:N``: stoker with ``backend=BACKEND`` and N workers (``process:2``, ``thread:4``).

Run: ``python benchmarks/after_break.py heavytail torch auto process:2 thread:4``
"""

from __future__ import annotations

import argparse
import gc
import time
import warnings
from typing import Any

import psutil
import torch.utils.data as tud

import stoker
from stoker.bench._plan import SeededSampler
from stoker.bench._workloads import consume, get_workload


def _loader(kind: str, dataset: Any, batch_size: int, torch_nw: int) -> Any:
    sampler = SeededSampler(len(dataset), 20_000, 1, 20_000)
    if kind == "torch":
        return tud.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=torch_nw,
            prefetch_factor=4,
            persistent_workers=True,
        )
    if kind == "auto":
        return stoker.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers="auto",
            prefetch_factor="auto",
        )
    backend, _, workers = kind.partition(":")
    return stoker.DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=int(workers), backend=backend
    )


def _tree_cpu_s() -> float:
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("contenders", nargs="+")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--idle", type=float, default=1.5)
    parser.add_argument("--torch-nw", type=int, default=4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    workload = get_workload(args.workload)
    dataset = workload.make_dataset(False)
    for kind in args.contenders:
        loader = _loader(kind, dataset, workload.batch_size, args.torch_nw)
        burnt = []
        for _ in range(args.epochs):
            t0 = time.perf_counter()
            for batch in loader:
                consume(batch)
                if time.perf_counter() - t0 > args.seconds:
                    break
            c0 = _tree_cpu_s()
            time.sleep(args.idle)
            burnt.append(_tree_cpu_s() - c0)
        print(
            f"{kind}: CPU seconds used in the {args.idle:.1f} s after each break: "
            + ", ".join(f"{b:.2f}" for b in burnt),
            flush=True,
        )
        del loader
        gc.collect()


if __name__ == "__main__":
    main()
