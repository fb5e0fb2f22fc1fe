"""DistributedDataParallel training on CPU with stoker's rank-aware loading.

Run with two processes on this machine (gloo backend, no GPU needed)::

    torchrun --nproc_per_node=2 examples/ddp_train.py --epochs 2

Each rank loads its own disjoint, equal share of the dataset (``distributed=True``); the order
changes every epoch without a ``set_epoch`` call; the loader's state is saved with the model,
so the run can resume mid-epoch, even with a different number of processes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.utils.data as tud
from torch.nn.parallel import DistributedDataParallel

import stoker
from stoker.sampling import World


class Regression(tud.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``y = x @ w + noise`` for a fixed ``w``: a model that learns it shows the loop works."""

    def __init__(self, n: int, features: int = 8) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.w = torch.randn(features, 1, generator=g)
        self.y = self.x @ self.w + 0.01 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint", type=Path, default=None, help="save/resume here")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun provides RANK, WORLD_SIZE, MASTER_ADDR...
    world = World.current()
    torch.manual_seed(0)  # the same initial weights on every rank
    dataset = Regression(args.samples)
    loader = stoker.DataLoader(
        dataset,
        batch_size=32,
        shuffle=True,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(42),  # the same seed on every rank
        distributed=True,
    )
    model = DistributedDataParallel(torch.nn.Linear(dataset.x.shape[1], 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if args.checkpoint is not None and args.checkpoint.exists():
        state = torch.load(args.checkpoint, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        loader.load_state_dict(state["loader"])  # mid-epoch, any world size
        start = state["loader"]["epoch"]

    for epoch in range(start, args.epochs):
        steps, total = 0, torch.zeros(())
        for x, y in loader:  # every rank runs the same number of steps
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            steps += 1
            total += loss.detach()
        dist.all_reduce(total)
        if world.rank == 0:
            mean = total.item() / (steps * world.world_size)
            print(f"epoch {epoch}: {steps} steps per rank, mean loss {mean:.4f}", flush=True)
        if args.checkpoint is not None and world.rank == 0:
            torch.save(
                {
                    "model": model.module.state_dict(),
                    "opt": opt.state_dict(),
                    "loader": loader.state_dict(),
                },
                args.checkpoint,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
