"""Trap: `persistent_workers=True` while loading in the main process (torch raises).

doctor: expect SK004
"""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ds = TensorDataset(torch.randn(256, 8))
    loader = DataLoader(ds, batch_size=32, num_workers=0, persistent_workers=True)
    for (x,) in loader:
        print(x.mean())


if __name__ == "__main__":
    main()
