"""``stoker tune`` against an exhaustive grid over the same space, on bench workloads.

The grid measures every configuration of :func:`stoker.tuner._tune.candidates` (both backends x
worker counts x prefetch), loading in the main process and any other configuration tune tried
(thread counts past 4 per core), each with the same :func:`stoker.tuner._tune.measure` and for as
long as tune measured its finalists (the precision at which tune picked its winner). Printed
per workload: tune's wall time over the grid's, and the grid's rate for tune's winner over the
grid's best. The grid's best is the highest of many short noisy measurements (biased upwards),
so both are then measured again, alternately, for ``--ab`` rounds of 2.4 s each, and the
medians compared.

Run: ``python benchmarks/tune_vs_grid.py [workload ...] [--ab N]`` (default: heavytail io
jpeg, 3 rounds)
"""

from __future__ import annotations

import argparse
import statistics
import time

from stoker._introspect.platform import usable_cores
from stoker.bench._workloads import get_workload
from stoker.tuner._tune import Candidate, candidates, measure, tune

AB_RUN_S = 2.4

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("workloads", nargs="*", default=["heavytail", "io", "jpeg"])
    parser.add_argument("--ab", type=int, default=3)
    args = parser.parse_args()
    for name in args.workloads:
        w = get_workload(name)
        ds = w.make_dataset(False)
        result = tune(ds, w.batch_size, output=None, budget_s=120)
        final_s = result.rounds[-1][0]
        space = [Candidate("process", 0, 2), *candidates(usable_cores())]
        # ... and whatever tune tried outside that space (thread counts past 4 per core, when
        # loading waits), so that the grid covers all tune could pick.
        tried = [c for _, scored in result.rounds for c, _ in scored]
        space += [c for c in dict.fromkeys(tried) if c not in space]
        t0 = time.perf_counter()
        grid = {cand: measure(ds, w.batch_size, cand, final_s) for cand in space}
        grid_s = time.perf_counter() - t0
        best = max(grid, key=grid.__getitem__)
        print(
            f"{name}: tune {result.seconds:.1f} s -> {result.best.label}; grid of {len(space)} "
            f"at {final_s:.1f} s each {grid_s:.1f} s -> {best.label} {grid[best]:,.0f}/s; "
            f"time ratio {result.seconds / grid_s:.0%}; tune's pick in the grid "
            f"{grid[result.best]:,.0f}/s = {grid[result.best] / grid[best]:.1%} of the best "
            f"({result.notes[0][:60] if result.notes else ''})",
            flush=True,
        )
        if args.ab and best != result.best:
            picks: dict[Candidate, list[float]] = {result.best: [], best: []}
            for _ in range(args.ab):
                for cand, rates in picks.items():
                    rates.append(measure(ds, w.batch_size, cand, AB_RUN_S))
            tuned, top = (statistics.median(picks[c]) for c in (result.best, best))
            print(
                f"  again, {args.ab} x {AB_RUN_S} s alternately: tune's pick {tuned:,.0f}/s, "
                f"the grid's best {top:,.0f}/s: {tuned / top:.1%}",
                flush=True,
            )
