"""Trap: `non_blocking=True` copies from a loader that does not pin memory.

doctor: expect SK007
"""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ds = TensorDataset(torch.randn(1024, 64), torch.randint(0, 10, (1024,)))
    loader = DataLoader(ds, batch_size=128, num_workers=1)
    model = torch.nn.Linear(64, 10).to(device)
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()


if __name__ == "__main__":
    main()
