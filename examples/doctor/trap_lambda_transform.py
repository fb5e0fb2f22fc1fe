"""Trap: a lambda as the dataset's transform; spawn cannot pickle it.

doctor: expect SK003
"""

import torch
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n: int, transform=None) -> None:
        self.data = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        x = self.data[i]
        return self.transform(x) if self.transform else x


def main() -> None:
    ds = Images(512, transform=lambda x: x.float() / 255)
    loader = DataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context="spawn")
    for batch in loader:
        print(batch.shape)


if __name__ == "__main__":
    main()
