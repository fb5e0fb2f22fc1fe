"""Factories for `stoker doctor module:factory`: one clean loader, and one per runtime trap.

Each factory's docstring names the code the doctor must report for it (`doctor: expect ...`).
Try: `stoker doctor examples/doctor/live_loaders.py:lambda_transform_spawn`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Vectors(Dataset):
    """Random feature vectors and labels held as tensors; `transform` is optional."""

    def __init__(self, n: int = 2048, dim: int = 32, transform=None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        return (self.transform(x) if self.transform else x), self.y[i]


def clean() -> DataLoader:
    """Tensors in, tensors out, one worker, nothing to fix.

    doctor: expect nothing
    """
    return DataLoader(Vectors(), batch_size=64, shuffle=True, num_workers=1)


def lambda_transform_spawn() -> DataLoader:
    """A lambda transform, with workers started by spawn: the first `iter()` fails.

    doctor: expect SK101
    """
    ds = Vectors(transform=lambda x: x * 2)
    return DataLoader(ds, batch_size=64, num_workers=1, multiprocessing_context="spawn")


class FileList(Dataset):
    """An ImageNet-style list of (path, label) tuples: 400,000 Python objects."""

    def __init__(self, n: int = 400_000) -> None:
        self.samples = [
            (f"/data/train/n{i % 1000:08d}/img_{i:07d}.JPEG", i % 1000) for i in range(n)
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        return torch.full((8,), float(len(path))), label


def python_lists() -> DataLoader:
    """Per-sample metadata in a list of tuples: each forked worker copies it (copy-on-read).

    doctor: expect SK301
    """
    return DataLoader(FileList(), batch_size=64, num_workers=1)


class SlowTail(Vectors):
    """Every 16th sample takes 40 ms (a large image, a cold file), the others ~nothing."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i % 16 == 15:
            time.sleep(0.04)
        return super().__getitem__(i)


def slow_tail() -> DataLoader:
    """A few slow samples stall in-order, round-robin delivery.

    doctor: expect SK401
    """
    return DataLoader(SlowTail(n=256), batch_size=16, num_workers=1)


class PilImages(Dataset):
    """Returns PIL images; a collate converts them, so batching works, but workers pickle PIL."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        from PIL import Image

        # Reading dominates, as with real images: a larger picture resized on load.
        big = Image.fromarray(np.full((384, 384, 3), i % 256, dtype=np.uint8))
        return big.resize((64, 64), Image.Resampling.BILINEAR)


def to_tensor_batch(images: list) -> torch.Tensor:
    return torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1) for im in images])


def pil_samples() -> DataLoader:
    """Samples are PIL images.

    doctor: expect SK402
    """
    return DataLoader(PilImages(), batch_size=32, num_workers=1, collate_fn=to_tensor_batch)


class H5Vectors(Dataset):
    """Opens its HDF5 file in `__init__`, in the main process, before the workers fork."""

    def __init__(self, path: Path) -> None:
        import h5py

        with h5py.File(path, "w") as f:
            f["x"] = np.arange(256 * 8, dtype=np.float32).reshape(256, 8)
        self.file = h5py.File(path, "r")

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.file["x"][i])


def h5py_opened_early() -> DataLoader:
    """An HDF5 handle inherited by forked workers.

    doctor: expect SK405
    """
    path = Path(tempfile.mkdtemp(prefix="stoker-doctor-example-")) / "x.h5"
    return DataLoader(H5Vectors(path), batch_size=32, num_workers=1, multiprocessing_context="fork")
