"""Two short runs watched by ``stoker.watch``: a starved one and a healthy one.

Both use torch's DataLoader with 2 worker processes over a dataset whose samples cost a fixed
sleep (no CPU contention, so the timings hold on a busy machine):

* starved: a batch costs a worker 32 ms but the training step only 5 ms, so the loop waits;
  workers deliver round-robin in lockstep, so the waits come in a sawtooth, and one sample
  hangs for 300 ms (a stall);
* healthy: the same loader under a 45 ms training step: the workers stay ahead.

Usage::

    python examples/monitor_demo.py [OUT_DIR]      # default: monitor-demo/
    stoker report OUT_DIR/starved.jsonl -o OUT_DIR/starved.png
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from stoker.monitor import watch
from stoker.monitor._report import load_run, summarize
from stoker.monitor._timeline import plot_timeline

SAMPLE_S = 0.004
BATCH = 8
HANG_INDEX = 8 * 150  # sample that hangs once (first batch of step 150)
HANG_S = 0.3


class SleepyDataset(Dataset[torch.Tensor]):
    def __init__(self, n: int, hang: bool) -> None:
        self.n, self.hang = n, hang

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(HANG_S if self.hang and i == HANG_INDEX else SAMPLE_S)
        return torch.full((16,), float(i))


def run(name: str, out: Path, steps: int, step_s: float, hang: bool) -> Path:
    loader = DataLoader(SleepyDataset(steps * BATCH, hang), batch_size=BATCH, num_workers=2)
    log = out / f"{name}.jsonl"
    for _batch in watch(loader, every=50, log=log):
        time.sleep(step_s)  # the training step
    run_log = load_run(log)
    plot_timeline(run_log, summarize(run_log), out / f"{name}.png")
    return log


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "monitor-demo")
    out.mkdir(parents=True, exist_ok=True)
    run("starved", out, steps=240, step_s=0.005, hang=True)
    run("healthy", out, steps=150, step_s=0.045, hang=False)
    print(f"wrote {out}/starved.png and {out}/healthy.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
