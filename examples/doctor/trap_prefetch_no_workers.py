"""Trap: `prefetch_factor` without workers (torch raises).

doctor: expect SK005
"""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ds = TensorDataset(torch.randn(256, 8))
    loader = DataLoader(ds, batch_size=32, prefetch_factor=4)
    for (x,) in loader:
        print(x.mean())


if __name__ == "__main__":
    main()
