"""Trap: DistributedSampler whose `set_epoch` is never called (same order every epoch).

Launch: torchrun --nproc_per_node=2 trap_distributed_no_set_epoch.py

doctor: expect SK011
"""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main(epochs: int = 3) -> None:
    dist.init_process_group("gloo")
    ds = TensorDataset(torch.arange(1024).float())
    sampler = DistributedSampler(ds, shuffle=True)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=1)
    for epoch in range(epochs):
        for (x,) in loader:
            print(epoch, x[:4])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
