"""Ramp runs of ``num_workers="auto"`` without the rest of the bench: how fast the controller
gets from 1 and from 16 workers to a reference rate, and the decisions it took.

The reference is given per workload (samples/s, e.g. the auto contender's median from a
``stoker bench --json`` run), so a change to the controller can be checked in a minute.

Run: ``python benchmarks/auto_ramp.py jpeg=441 large=9660 [--seconds 10] [--starts 1,16]``
"""

from __future__ import annotations

import argparse

from stoker.bench._ramp import measure_ramp
from stoker.bench._workloads import get_workload

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("targets", nargs="+", help="WORKLOAD=REFERENCE_SAMPLES_PER_S")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--starts", default="1,16")
    args = parser.parse_args()
    for target in args.targets:
        name, reference = target.split("=")
        workload = get_workload(name)
        dataset = workload.make_dataset(False)
        for start in (int(s) for s in args.starts.split(",")):
            ramp = measure_ramp(dataset, workload, start, args.seconds, float(reference))
            reach = f"{ramp.reach_s:.1f} s" if ramp.reach_s is not None else "not reached"
            share = (
                f" ({ramp.reach_s / ramp.epoch_s:.0%} of an epoch)"
                if ramp.reach_s is not None and ramp.epoch_s
                else ""
            )
            print(
                f"{name} from {start}: 95% of {float(reference):,.0f}/s {reach}{share}, "
                f"ends at {ramp.final_workers} {ramp.backend}",
                flush=True,
            )
            for note in ramp.decisions[1:]:
                print(f"    {note}")
