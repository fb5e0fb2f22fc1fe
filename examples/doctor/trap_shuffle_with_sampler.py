"""Trap: `shuffle=True` and a sampler at once (torch raises).

doctor: expect SK012
"""

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


def main() -> None:
    ds = TensorDataset(torch.randn(256, 8))
    loader = DataLoader(ds, batch_size=32, shuffle=True, sampler=RandomSampler(ds))
    for (x,) in loader:
        print(x.mean())


if __name__ == "__main__":
    main()
