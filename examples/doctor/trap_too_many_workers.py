"""Trap: a worker count copied from a 64-core server, run on a smaller machine.

doctor: expect SK009
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

NUM_WORKERS = 64


def main() -> None:
    ds = TensorDataset(torch.randn(1024, 64))
    loader = DataLoader(ds, batch_size=128, num_workers=NUM_WORKERS)
    for (x,) in loader:
        print(x.shape)


if __name__ == "__main__":
    main()
