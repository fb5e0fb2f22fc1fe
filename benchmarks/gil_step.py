"""Thread workers against a training step that holds the GIL.

Thread workers share the interpreter with the training loop: while a step runs Python (a
hand-written loop, logging, a Python-side augmentation), the workers' Python parts wait for
the GIL, and the step waits for theirs. This measures what that costs on the bench's waiting
workloads, where ``backend="auto"`` picks threads.

Per workload and step length, contenders run alternately for ``--rounds`` rounds; each round
builds a fresh loader, lets it settle for ``--settle`` seconds (the auto controller ramps up),
then measures ``--seconds`` seconds of a loop whose "step" spins in pure Python for
``--step-ms`` milliseconds per batch. Printed: samples/s (median of rounds) and the step's own
median wall time (inflated when it waits for the GIL), for

* stoker, ``num_workers="auto"`` (the backend the probe picks, threads here);
* stoker, ``backend="process"``, ``num_workers="auto"``;
* torch's DataLoader at a fixed ``--torch-nw`` / ``--torch-pf`` (the bench's best grid point).

The ideal is the lower of the loader's rate without a step and ``batch / step``.

Run: ``python benchmarks/gil_step.py WORKLOAD --step-ms MS [--torch-nw N --torch-pf P]``
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch.utils.data as tud
from _common import endless_sampler

import stoker
from stoker._commands.step import consume
from stoker.bench._contenders import close_loader
from stoker.bench._workloads import get_workload


def spin(seconds: float) -> None:
    """Hold the GIL for ``seconds`` in pure Python (a Python-heavy training step)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for i in range(200):
            x += i


def run(make: Callable[[], Any], settle: float, seconds: float, step: float) -> tuple[float, float]:
    """(samples/s, median step wall time) of one fresh loader."""
    loader = make()
    it = iter(loader)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < settle:
        consume(next(it))
        if step:
            spin(step)
    samples, steps = 0, []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        samples += consume(next(it))
        if step:
            s0 = time.perf_counter()
            spin(step)
            steps.append(time.perf_counter() - s0)
    result = samples / (time.perf_counter() - t0)
    del it
    close_loader(loader)
    return result, statistics.median(steps) if steps else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload")
    parser.add_argument("--step-ms", type=float, nargs="+", default=[0.0, 10.0])
    parser.add_argument("--torch-nw", type=int, default=8)
    parser.add_argument("--torch-pf", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    w = get_workload(args.workload)
    ds = w.make_dataset(False)
    bs = w.batch_size
    contenders: dict[str, Callable[[], Any]] = {
        "stoker auto": lambda: stoker.DataLoader(
            ds, batch_size=bs, sampler=endless_sampler(ds), num_workers="auto"
        ),
        "stoker process auto": lambda: stoker.DataLoader(
            ds, batch_size=bs, sampler=endless_sampler(ds), num_workers="auto", backend="process"
        ),
        f"torch nw={args.torch_nw} pf={args.torch_pf}": lambda: tud.DataLoader(
            ds,
            batch_size=bs,
            sampler=endless_sampler(ds),
            num_workers=args.torch_nw,
            prefetch_factor=args.torch_pf,
            persistent_workers=True,
        ),
    }
    for step_ms in args.step_ms:
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        steps: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, make in contenders.items():
                r, s = run(make, args.settle, args.seconds, step_ms / 1e3)
                rates[name].append(r)
                steps[name].append(s)
        print(
            f"{args.workload}, step {step_ms:g} ms (batch {bs}; the step alone allows "
            f"{bs / (step_ms / 1e3) if step_ms else float('inf'):,.0f} samples/s):"
        )
        for name in contenders:
            med = statistics.median(rates[name])
            spread = (max(rates[name]) - min(rates[name])) / med if med else 0.0
            step_s = statistics.median(steps[name])
            print(
                f"  {name:<22} {med:>9,.0f} samples/s (spread {spread:.0%}), "
                f"step {step_s * 1e3:.1f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
