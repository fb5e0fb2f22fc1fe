"""A small training loop that follows every data-loading rule the doctor checks.

doctor: expect nothing
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from stoker._platform import usable_cores


class Squares(Dataset):
    """x -> x**2 on random vectors: cheap, picklable, returns tensors."""

    def __init__(self, n: int = 512, dim: int = 16) -> None:
        self.x = torch.randn(n, dim)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        return x, x.pow(2)


def main(epochs: int = 2) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    workers = max(1, min(2, usable_cores() - 1))
    loader = DataLoader(
        Squares(),
        batch_size=64,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
        pin_memory=torch.cuda.is_available(),
    )
    model = torch.nn.Linear(16, 16).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(epochs):
        total = 0.0
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
