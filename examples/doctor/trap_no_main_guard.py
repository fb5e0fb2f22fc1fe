"""Trap: the training loop runs on import, with no `if __name__ == "__main__":` guard.

Works with fork on Linux before Python 3.14; under spawn (macOS, Windows) or forkserver every
worker re-imports this file, re-runs `train()` and crashes while bootstrapping.

doctor: expect SK001
"""

import torch
from torch.utils.data import DataLoader, TensorDataset


def train() -> None:
    ds = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2)
    model = torch.nn.Linear(8, 2)
    for x, y in loader:
        torch.nn.functional.cross_entropy(model(x), y).backward()


train()
