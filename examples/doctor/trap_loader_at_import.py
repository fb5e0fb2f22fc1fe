"""Trap: the dataset and a loader with workers are built at module level.

Every spawn/forkserver worker re-imports this file and rebuilds both before loading a sample.

doctor: expect SK002
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,)))
loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=2)


def main() -> None:
    model = torch.nn.Linear(32, 10)
    for x, y in loader:
        torch.nn.functional.cross_entropy(model(x), y).backward()


if __name__ == "__main__":
    main()
