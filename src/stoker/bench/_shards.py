"""The ``shards`` workload: the ``jpeg`` pipeline read from packed tar shards.

The same synthetic JPEGs as the ``jpeg`` workload (same count, same augmentation, same labels)
are packed once with :func:`stoker.shards.pack` into the cache directory and read back through
:class:`stoker.shards.ShardDataset` (mmap + index, zero-copy bytes) instead of one ``open`` per
file. Run it next to ``jpeg`` in one ``stoker bench`` call to compare packed with loose files.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from stoker.bench._jpeg import (
    FULL_IMAGES,
    MEAN,
    OUT_SIZE,
    QUICK_IMAGES,
    STD,
    ensure_images,
    random_resized_crop_box,
)
from stoker.bench._workloads import Workload, cache_dir, register
from stoker.shards import IncompleteShardsError, ShardDataset, pack

__all__ = ["JpegFilesSource", "ShardJpegDataset", "augment", "ensure_shards"]

SHARD_DIR = "jpeg-v1-shards-{count}"
SHARD_SIZE = 32 * 1000 * 1000


class JpegFilesSource:
    """A pack source over a list of JPEG files: key = index, fields ``jpg`` and ``cls``."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = list(paths)
        self.description = f"bench-jpeg:{len(self.paths)}"
        self.meta = {"source": "bench-jpeg"}

    def __len__(self) -> int:
        return len(self.paths)

    def sample(self, index: int) -> tuple[str, list[tuple[str, bytes]]]:
        with open(self.paths[index], "rb") as f:
            data = f.read()
        return f"{index:08d}", [("cls", str(index % 1000).encode()), ("jpg", data)]


def ensure_shards(count: int, directory: Path | None = None) -> Path:
    """Pack the first ``count`` bench JPEGs into shards once (resuming an interrupted pack).

    Returns:
        The shard directory.
    """
    out = directory if directory is not None else cache_dir() / SHARD_DIR.format(count=count)
    try:
        ShardDataset(out, verify="off").close()
        return out
    except IncompleteShardsError:
        pass
    source = JpegFilesSource(ensure_images(count))
    resume = out.exists() and any(out.iterdir())
    pack(source, out, shard_size=SHARD_SIZE, workers=min(4, os.cpu_count() or 1), resume=resume)
    return out


class ShardJpegDataset(Dataset[tuple[torch.Tensor, int]]):
    """``JpegDataset``'s decode + random-resized-crop + flip + normalize, from tar shards.

    Args:
        directory: shards packed by :func:`ensure_shards`.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.shards = ShardDataset(directory, verify="off")

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        return augment(self.shards.raw(idx))


def augment(sample: Mapping[str, Any]) -> tuple[torch.Tensor, int]:
    """Decode a sample's ``jpg``, crop, flip and normalize it; its ``cls`` is the label.

    Shared by every reader of the bench's JPEG shards (the ``shards`` and ``remote``
    workloads), so that they all do the same work per sample.
    """
    from PIL import Image

    with Image.open(io.BytesIO(sample["jpg"])) as encoded:
        img = encoded.convert("RGB")
    box = random_resized_crop_box(img.width, img.height)
    img = img.resize((OUT_SIZE, OUT_SIZE), Image.Resampling.BILINEAR, box=box)
    arr = np.asarray(img, dtype=np.float32)
    if torch.rand(1).item() < 0.5:
        arr = arr[:, ::-1]
    arr = (arr * (1 / 255) - MEAN) / STD
    label = int(bytes(sample["cls"]))
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), label


def _shards(quick: bool) -> ShardJpegDataset:
    return ShardJpegDataset(ensure_shards(QUICK_IMAGES if quick else FULL_IMAGES))


register(
    Workload(
        name="shards",
        description="the jpeg workload read from packed tar shards (mmap + index) instead of files",
        make_dataset=_shards,
        batch_size=64,
    )
)
