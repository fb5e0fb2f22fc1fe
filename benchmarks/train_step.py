"""Training steps per second of loaders feeding the bench's training steps (both shapes).

The steps are those of ``stoker bench``'s train family (``stoker.bench._train``): ``gpu`` (a
launch phase of small torch ops holding the GIL, then a 20 ms sleep standing in for the
device) and ``cpu`` (an MLP's forward and backward on torch's intra-op threads). Per round,
each contender builds a fresh loader, feeds the step ``--settle`` seconds untimed (the auto
controller and the handover decide then), then ``--seconds`` timed. ``memory`` is the step
fed from batches held in memory. Printed per contender: steps/s (median of rounds, each
round's figure), the step's own time and the wait for data per step, and where a stoker
loader ended (backend and workers).

Contenders: those of ``_common.contender`` (``auto``, ``auto:thread``, ``torchN[:P]``,
``stokerN``, ``process:N``, ``thread:N``, ``spdlN``, ``torchdataN[:P]``); a stoker contender
named with ``+spin`` (``auto+spin``) runs with ``STOKER_OPENMP_THROTTLE=0``, libgomp's
spinning left as it is (see ``stoker/loader/_openmp.py``).

Run: ``python benchmarks/train_step.py io auto spdl16 torchdata8:4 --shape cpu``
"""

from __future__ import annotations

import itertools
import os
import statistics
from typing import Any
from unittest import mock

from _common import contender, contenders_parser, endless_sampler, open_workload

import stoker
from stoker.bench._contenders import close_loader
from stoker.bench._train import SHAPES, make_step, memory_batches, train_loop
from stoker.bench._train_result import TrainSample

SPINNING = "+spin"  # the throttle off: STOKER_OPENMP_THROTTLE=0 (read when an iterator starts)


def one_round(loader: Any, step: Any, settle: float, seconds: float) -> tuple[TrainSample, str]:
    it = iter(loader)
    try:
        train_loop(it, step, seconds=settle)
        sample = train_loop(it, step, seconds=seconds, min_steps=2)
    finally:
        del it
    ended = ""
    if isinstance(loader, stoker.DataLoader):
        stats = loader.stats()
        ended = f"{stats.backend}:{stats.num_workers}"
    close_loader(loader)
    if sample is None:
        raise SystemExit("the loader gave no batch")
    return sample, ended


def main() -> None:
    parser = contenders_parser(__doc__ or "")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    names = list(args.contenders)
    workload, dataset = open_workload(args.workload)
    held = memory_batches(dataset, workload)
    step = make_step(args.shape)
    results: dict[str, list[tuple[TrainSample, str]]] = {n: [] for n in ["memory", *names]}
    for _ in range(args.rounds):
        for name in results:
            if name == "memory":
                sample = train_loop(itertools.cycle(held), step, seconds=args.seconds)
                assert sample is not None  # held batches never run out
                results[name].append((sample, ""))
            else:
                sampler = endless_sampler(dataset)
                base = name.removesuffix(SPINNING)
                loader = contender(base, dataset, workload.batch_size, sampler)
                off = {"STOKER_OPENMP_THROTTLE": "0"} if base != name else {}
                with mock.patch.dict(os.environ, off):
                    results[name].append(one_round(loader, step, args.settle, args.seconds))
    print(f"{args.workload}, {args.shape} step ({SHAPES[args.shape]}); {args.rounds} rounds")
    for name, runs in results.items():
        rates = [s.steps / s.seconds for s, _ in runs]
        step_ms = statistics.median(1e3 * s.step_s / s.steps for s, _ in runs)
        wait_ms = statistics.median(1e3 * s.wait_s / s.steps for s, _ in runs)
        ended = " ".join(e for _, e in runs if e)
        print(
            f"  {name:<14} {statistics.median(rates):6.1f} steps/s  step {step_ms:5.1f} ms  "
            f"wait {wait_ms:5.1f} ms  runs {' '.join(f'{r:.1f}' for r in rates)}"
            + (f"  ended {ended}" if ended else ""),
            flush=True,
        )


if __name__ == "__main__":
    main()
