"""Samples/s of stoker's process workers with their shared-memory directory at DIR (a small
tmpfs standing in for a container's /dev/shm) against the default one, alternating runs.

    mount -t tmpfs -o size=64m tmpfs /mnt/shm64
    python benchmarks/small_shm.py /mnt/shm64 --sample-mib 1 --batch-size 8 --workers 4

Each run is a fresh interpreter (``STOKER_SHM_DIR`` is read when the workers start) that warms
one epoch of its persistent workers and times the second; it prints samples/s and how many
batches found no room in shared memory (spilled to the temp directory, or piped).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

RUN = """
import sys, time, warnings
import numpy as np, torch, torch.utils.data as tud
import stoker

class Blobs(tud.Dataset):
    def __init__(self, n, nbytes):
        self.n, self.nbytes = n, nbytes
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.from_numpy(np.full(self.nbytes // 4, i, dtype=np.float32))

if __name__ == "__main__":
    n, nbytes, batch, workers = (int(a) for a in sys.argv[1:5])
    warnings.simplefilter("ignore")
    loader = stoker.DataLoader(Blobs(n, nbytes), batch_size=batch, num_workers=workers)
    for _ in loader:
        pass
    t0 = time.perf_counter()
    count = sum(b.shape[0] for b in loader)
    rate = count / (time.perf_counter() - t0)
    st = loader.stats()
    print(rate, st.spilled_batches, st.fallback_batches)
"""


def run(directory: str | None, args: argparse.Namespace) -> tuple[float, int, int]:
    env = dict(os.environ)
    env.pop("STOKER_SHM_DIR", None)
    if directory:
        env["STOKER_SHM_DIR"] = directory
    argv = [str(args.samples), str(int(args.sample_mib * (1 << 20))), str(args.batch_size)]
    out = subprocess.run(
        [sys.executable, "-c", RUN, *argv, str(args.workers)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), int(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the small shared-memory directory (a tmpfs)")
    parser.add_argument("--sample-mib", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {args.directory: [], "default": []}
    for _ in range(args.rounds):
        for key, directory in ((args.directory, args.directory), ("default", None)):
            rate, spilled, piped = run(directory, args)
            rates[key].append(rate)
            print(f"{key}: {rate:,.0f} samples/s ({spilled} batches spilled, {piped} piped)")
    small, default = (statistics.median(rates[k]) for k in (args.directory, "default"))
    print(f"median: {small:,.0f} vs {default:,.0f} samples/s ({small / default:.2f}x)")


if __name__ == "__main__":
    main()
