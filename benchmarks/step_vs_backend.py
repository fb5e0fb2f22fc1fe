"""Training steps per second with thread or process workers, against a GPU-like step.

The step stands in for a training step on an accelerator: a launch phase of small torch ops
that holds the GIL (calibrated to ``--launch-ms`` on this machine before any loader starts),
then a device wait that releases it (a sleep of ``--wait-ms``). Thread workers share the
interpreter with the launch phase; process workers share only the cores.

Per workload, the contenders run alternately for ``--rounds`` rounds; each round builds a fresh
loader, runs ``--settle`` seconds of steps (the auto controller ramps up), then measures
``--seconds`` seconds. Printed per contender: steps/s (median of rounds, and the spread), the
launch phase's median wall time (inflated when it waits for the GIL or a core) and the share of
the time spent waiting for data. ``memory`` is the same step fed one batch held in memory.

Contenders: ``auto`` (stoker, ``num_workers="auto"``), ``auto:thread`` / ``auto:process``
(``num_workers="auto"`` with that backend), and those of ``_common.contender`` (``torchN``,
``stokerN``, ``thread:N``, ``process:N``).

Run: ``python benchmarks/step_vs_backend.py io auto:thread auto:process auto``
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from _common import contender, contenders_parser, endless_sampler, open_workload

import stoker
from stoker._commands.step import consume
from stoker.bench._contenders import close_loader


def _ops(count: int, x: torch.Tensor) -> torch.Tensor:
    """``count`` small torch ops (each a dispatch that holds the GIL, as a kernel launch)."""
    for _ in range(count):
        x = x * 1.0001 + 0.5
    return x


def calibrate(launch_s: float) -> int:
    """How many of :func:`_ops`'s ops take ``launch_s`` here (by the median of many short
    timings: another process taking the core for a moment skews one of them, not the
    median)."""
    x = torch.ones(64)
    count = 200
    _timed(count, x)  # warm-up: first calls pay for dispatch caches
    per_op = statistics.median(_timed(count, x) for _ in range(25)) / count
    return max(1, round(launch_s / per_op))


def _timed(count: int, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    _ops(count, x)
    return time.perf_counter() - t0


def run(
    loader: Any, ops: int, wait_s: float, settle: float, seconds: float
) -> tuple[float, float, float, str]:
    """(steps/s, median launch seconds, share of time waiting for data, where a stoker loader
    ended: backend and workers) of one loader."""
    it = iter(loader) if loader is not None else None
    batch: Any = None
    x = torch.ones(64)
    launches: list[float] = []
    waited = 0.0
    steps = 0
    start = time.perf_counter()
    t0 = start
    while True:
        now = time.perf_counter()
        if t0 == start and now - start >= settle:
            t0, steps, waited, launches = now, 0, 0.0, []
        if t0 != start and now - t0 >= seconds:
            break
        w0 = time.perf_counter()
        if it is not None:
            batch = next(it)
        if batch is not None:
            consume(batch)
        w1 = time.perf_counter()
        _ops(ops, x)
        w2 = time.perf_counter()
        time.sleep(wait_s)
        waited += w1 - w0
        launches.append(w2 - w1)
        steps += 1
    wall = time.perf_counter() - t0
    del it
    ended = ""
    if isinstance(loader, stoker.DataLoader):
        stats = loader.stats()
        ended = f"{stats.backend}:{stats.num_workers}"
    if loader is not None:
        close_loader(loader)
    return steps / wall, statistics.median(launches), waited / wall, ended


def main() -> None:
    parser = contenders_parser(__doc__ or "")
    parser.add_argument("--launch-ms", type=float, default=2.0)
    parser.add_argument("--wait-ms", type=float, default=20.0)
    parser.add_argument("--ops", type=int, help="ops in the launch phase (default: calibrated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    workload, dataset = open_workload(args.workload)
    ops = args.ops or calibrate(args.launch_ms / 1e3)
    names = ["memory", *args.contenders]
    results: dict[str, list[tuple[float, float, float, str]]] = {name: [] for name in names}
    held = next(iter(torch.utils.data.DataLoader(dataset, batch_size=workload.batch_size)))
    for _ in range(args.rounds):
        for name in names:
            if name == "memory":
                results[name].append(_held(held, ops, args))
                continue
            loader = contender(name, dataset, workload.batch_size, endless_sampler(dataset))
            results[name].append(run(loader, ops, args.wait_ms / 1e3, args.settle, args.seconds))
    print(
        f"{args.workload} (batch {workload.batch_size}), step: {ops} small torch ops "
        f"({_timed(ops, torch.ones(64)) * 1e3:.2f} ms now) + {args.wait_ms:g} ms wait; "
        f"{args.rounds} rounds, medians"
    )
    for name in names:
        rates = [r[0] for r in results[name]]
        med = statistics.median(rates)
        spread = (max(rates) - min(rates)) / med if med else 0.0
        launch = statistics.median(r[1] for r in results[name])
        waits = statistics.median(r[2] for r in results[name])
        print(
            f"  {name:<18} {med:6.2f} steps/s (spread {spread:4.0%})  launch "
            f"{launch * 1e3:5.2f} ms  waiting for data {waits:4.0%}  "
            f"runs {' '.join(f'{r:.2f}' for r in rates)}"
            + (f"  ended {' '.join(r[3] for r in results[name])}" if results[name][0][3] else ""),
            flush=True,
        )


def _held(batch: Any, ops: int, args: Any) -> tuple[float, float, float, str]:
    """The step fed one batch held in memory (no loader)."""

    class Held:
        def __iter__(self) -> Any:
            while True:
                yield batch

    return run(Held(), ops, args.wait_ms / 1e3, 0.0, args.seconds)


if __name__ == "__main__":
    main()
