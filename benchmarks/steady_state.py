"""Steady-state samples/s inside one long epoch, against the bench's timed runs.

``stoker bench`` times each run from the start of an epoch (a fresh loader, a warm-up pass,
then ``run_s`` seconds of a new epoch), so its rates include how fast a loader fills an empty
pipeline. A training epoch lasts minutes, where that fill hardly counts. This measures the
rate the loading settles at: for each contender, alternately for ``--rounds`` rounds, a fresh
loader over an endless sampler (one epoch) is warmed up for ``--settle`` seconds and then
timed for ``--seconds`` seconds. Contenders:

``auto``, ``torchN[:P]``, ``stokerN``, ``process:N``, ``thread:N`` (see
``_common.contender``).

Run: ``python benchmarks/steady_state.py heavytail auto torch8``
"""

from __future__ import annotations

import functools
import gc
import statistics

from _common import contender, contenders_parser, open_workload
from _common import rate as common_rate

from stoker.bench._plan import SeededSampler


def main() -> None:
    parser = contenders_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    workload, dataset = open_workload(args.workload)
    rates: dict[str, list[float]] = {kind: [] for kind in args.contenders}
    for r in range(args.rounds):
        for kind in args.contenders:
            sampler = SeededSampler(len(dataset), 10**9, seed=3)
            make = functools.partial(contender, kind, dataset, workload.batch_size, sampler)
            rate = common_rate(make, args.seconds, settle=args.settle)
            gc.collect()
            rates[kind].append(rate)
            print(f"round {r + 1}: {kind}: {rate:,.0f} samples/s", flush=True)
    for kind, values in rates.items():
        print(f"{kind}: median {statistics.median(values):,.0f} samples/s")


if __name__ == "__main__":
    main()
