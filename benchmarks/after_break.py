"""CPU that a loader burns after the loop leaves an epoch early.

A training loop that ``break``s out of an epoch (a step limit, a validation every N steps)
and then does something else leaves persistent workers with the epoch's prefetched batches.
For each contender, a fresh loader runs ``--epochs`` epochs of ``--seconds`` seconds each on a
bench workload; after each ``break`` the script sleeps ``--idle`` seconds (the loop's "other
work") and prints the CPU seconds the process tree used meanwhile (what the workers took from
that other work). Contenders: ``auto``, ``torchN[:P]``, ``stokerN``, ``process:N``,
``thread:N`` (see ``_common.contender``).

Run: ``python benchmarks/after_break.py heavytail torch4:4 auto process:2 thread:4``
"""

from __future__ import annotations

import gc
import time

import psutil
from _common import contender, contenders_parser, open_workload

from stoker._commands.step import consume
from stoker.bench._plan import SeededSampler


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
    parser = contenders_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--idle", type=float, default=1.5)
    args = parser.parse_args()
    workload, dataset = open_workload(args.workload)
    for kind in args.contenders:
        sampler = SeededSampler(len(dataset), 20_000, 1, 20_000)
        loader = contender(kind, dataset, workload.batch_size, sampler)
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
