"""Run by torchrun in the distributed tests: one process per rank, gloo backend, CPU.

Usage: ``torchrun ... _rank_script.py MODE OUT_DIR [options]``. Every rank writes
``OUT_DIR/rank{R}.json`` with what it saw; the tests read and compare them.

Modes:
    train    two full epochs, then ``--steps`` batches of the third; the loader's state after
             them is saved to ``OUT_DIR/ckpt.pt`` by rank 0 (the usual checkpoint pattern).
    resume   load ``--ckpt`` and finish that epoch; then ``--steps`` batches of the next one
             and save a checkpoint again (if ``--steps`` > 0).
    mismatch each rank builds a dataset of a different length; the loader must raise.
    stream   two epochs of ``ShardDataset(--shards).stream()`` through ``distributed=True``
             (each sample's id is its key).
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data as tud

from stoker import DataLoader
from stoker.errors import ConfigError

BATCH = 3


class Indices(tud.Dataset[int]):
    """Sample ``i`` is ``i``: what a rank loaded is what it received."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def key_id(sample: dict[str, Any]) -> int:
    """A shard sample's key is its id."""
    return int(sample["__key__"])


def _flat(batches: list[Any]) -> list[int]:
    return [int(x) for b in batches for x in b]


def _epoch(loader: DataLoader, steps: int | None = None) -> list[list[int]]:
    out = []
    it = iter(loader)
    while steps is None or len(out) < steps:  # never fetch a batch that is not used
        try:
            out.append(next(it).tolist())
        except StopIteration:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "resume", "mismatch", "stream"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--samples", type=int, default=23)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--ckpt", type=Path)
    parser.add_argument("--shards", type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report: dict[str, Any] = {"rank": rank, "world_size": dist.get_world_size()}
    try:
        if args.mode == "mismatch":
            loader = DataLoader(Indices(args.samples + rank), batch_size=BATCH, distributed=True)
            try:
                next(iter(loader))
            except ConfigError as exc:
                report["error"] = str(exc)
            return
        if args.mode == "stream":
            from stoker.shards import ShardDataset

            shards = ShardDataset(args.shards, transform=key_id)
            stream = DataLoader(
                shards.stream(buffer_size=4, seed=5),
                batch_size=BATCH,
                num_workers=args.workers,
                distributed=True,
            )
            report["len"] = len(stream)
            report["epochs"] = [_epoch(stream), _epoch(stream)]
            return
        loader = DataLoader(
            Indices(args.samples),
            batch_size=BATCH,
            shuffle=True,
            num_workers=args.workers,
            generator=torch.Generator().manual_seed(7),
            distributed=True,
        )
        report["len"] = len(loader)
        if args.mode == "train":
            report["epochs"] = [_epoch(loader), _epoch(loader)]
            # A user's DistributedSampler: stoker calls set_epoch for it, once noticed.
            sampler = tud.DistributedSampler(Indices(args.samples), shuffle=True, seed=3)
            plain = DataLoader(
                Indices(args.samples), batch_size=BATCH, sampler=sampler, distributed=True
            )
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                report["user_sampler_epochs"] = [_epoch(plain) for _ in range(3)]
            report["notices"] = [str(w.message) for w in caught]
        else:
            loader.load_state_dict(torch.load(args.ckpt, weights_only=False))
            report["resumed"] = _epoch(loader)
        if args.steps > 0:
            report["partial"] = _epoch(loader, args.steps)
            state = loader.state_dict()
            if rank == 0:
                torch.save(state, args.out / "ckpt.pt")
    finally:
        (args.out / f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
