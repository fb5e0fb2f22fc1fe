"""Trap: one worker per host core, as `os.cpu_count()` reports them.

doctor: expect SK008
"""

import os

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ds = TensorDataset(torch.randn(1024, 64))
    loader = DataLoader(ds, batch_size=128, num_workers=os.cpu_count())
    for (x,) in loader:
        print(x.shape)


if __name__ == "__main__":
    main()
