"""Trap: a new DataLoader (and new workers) every epoch.

doctor: expect SK010
"""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main(epochs: int = 3) -> None:
    ds = TensorDataset(torch.randn(1024, 64))
    for epoch in range(epochs):
        loader = DataLoader(ds, batch_size=128, shuffle=True, num_workers=2)
        for (x,) in loader:
            print(epoch, x.shape)


if __name__ == "__main__":
    main()
