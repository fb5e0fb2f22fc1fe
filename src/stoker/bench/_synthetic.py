"""Built-in workloads made of synthetic samples: tiny, large, heavytail, io, memory, epochs.

Every dataset here is a module-level class holding only picklable state, so that it works
under every multiprocessing start method; its samples are a deterministic function of the
index, so every contender does exactly the same work.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch.utils.data import Dataset

from stoker.bench._workloads import Workload, register

__all__ = [
    "EpochsDataset",
    "HeavyTailDataset",
    "IODataset",
    "LargeDataset",
    "PathsDataset",
    "TinyDataset",
]

_FEATURES = 64
# heavytail: about 2 ms of numpy per sample; 1 sample in SLOW_EVERY waits SLOW_WAIT_S more.
HEAVY_ELEMENTS = 65_536
SLOW_EVERY = 100
SLOW_WAIT_S = 0.150
# io: IO_WAIT_S of waiting (remote-storage latency) plus about 0.5 ms of CPU.
IO_WAIT_S = 0.005
IO_ELEMENTS = 16_384
# epochs: about 0.5 ms of CPU per sample.
EPOCH_ELEMENTS = 16_384


def _numpy_work(idx: int, elements: int) -> torch.Tensor:
    """CPU work in numpy (single-threaded, no BLAS) whose result depends on ``idx``."""
    rng = np.random.default_rng(idx)
    x = np.sin(np.cumsum(rng.random(elements)))
    return torch.from_numpy(x[:: elements // _FEATURES].astype(np.float32))


def _is_slow(idx: int) -> bool:
    """A fixed pseudo-random 1/SLOW_EVERY of indices (Knuth's multiplicative hash)."""
    return ((idx * 2_654_435_761) & 0xFFFFFFFF) % SLOW_EVERY == 0


class TinyDataset(Dataset[torch.Tensor]):
    """Samples of 64 int64 tokens: per-sample and per-batch overhead dominate."""

    def __init__(self, n: int = 65_536, seq_len: int = 64) -> None:
        self.tokens = np.random.default_rng(0).integers(0, 50_000, (n, seq_len), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, idx: int) -> torch.Tensor:
        return torch.from_numpy(self.tokens[idx])


class LargeDataset(Dataset[torch.Tensor]):
    """3x224x224 float32 samples (588 KiB) with trivial work: the batch transport dominates."""

    def __init__(self, n: int = 16_384, distinct: int = 8) -> None:
        self.n = n
        gen = torch.Generator().manual_seed(0)
        self.base = torch.rand((distinct, 3, 224, 224), generator=gen)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> torch.Tensor:
        return self.base[idx % len(self.base)].clone()


class HeavyTailDataset(Dataset[tuple[torch.Tensor, int]]):
    """About 2 ms of numpy per sample; 1% of samples wait 150 ms more (step-time spikes)."""

    def __init__(self, n: int = 100_000) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        x = _numpy_work(idx, HEAVY_ELEMENTS)
        if _is_slow(idx):
            time.sleep(SLOW_WAIT_S)
        return x, idx % 1000


class IODataset(Dataset[tuple[torch.Tensor, int]]):
    """About 5 ms of waiting (remote storage) and 0.5 ms of CPU per sample."""

    def __init__(self, n: int = 100_000) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        time.sleep(IO_WAIT_S)
        return _numpy_work(idx, IO_ELEMENTS), idx % 1000


class PathsDataset(Dataset[tuple[int, int]]):
    """3M Python path strings read at random: forked workers copy the pages they read.

    Reading a ``str`` touches its reference count, so a worker that reads a random sample of
    the list writes to (and so privately copies) most of the pages that hold the strings.
    """

    def __init__(self, n: int = 3_000_000) -> None:
        self.paths = [f"train/n{i % 1000:08d}/image_{i:09d}.JPEG" for i in range(n)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int) -> tuple[int, int]:
        path = self.paths[idx]
        return len(path), ord(path[-6])


class EpochsDataset(Dataset[tuple[torch.Tensor, int]]):
    """About 0.5 ms of CPU per sample, for timing epoch starts."""

    def __init__(self, n: int = 2_048) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        return _numpy_work(idx, EPOCH_ELEMENTS), idx % 1000


def _tiny(quick: bool) -> TinyDataset:
    return TinyDataset()


def _large(quick: bool) -> LargeDataset:
    return LargeDataset()


def _heavytail(quick: bool) -> HeavyTailDataset:
    return HeavyTailDataset()


def _io(quick: bool) -> IODataset:
    return IODataset()


def _memory(quick: bool) -> PathsDataset:
    return PathsDataset(1_000_000 if quick else 3_000_000)


def _epochs(quick: bool) -> EpochsDataset:
    return EpochsDataset(1_024 if quick else 2_048)


register(
    Workload(
        name="tiny",
        description="64 int64 tokens per sample: per-sample and per-batch overhead",
        make_dataset=_tiny,
        batch_size=256,
        in_quick=True,
    )
)
register(
    Workload(
        name="large",
        description="64 x 3x224x224 float32 batches, trivial per-sample work: transport cost",
        make_dataset=_large,
        batch_size=64,
        in_quick=True,
        ideal_note=(
            "usable cores / single-process CPU seconds per sample with torch's default_collate "
            "into freshly allocated memory (page faults included), the work torch's loader "
            "does; stoker collates into reused memory and skips most of it, so it is no limit"
        ),
        ideal_is_limit=False,
    )
)
register(
    Workload(
        name="heavytail",
        description="~2 ms of numpy per sample, 1% of samples wait 150 ms more",
        make_dataset=_heavytail,
        batch_size=64,
        in_quick=False,  # a 1% tail needs runs longer than quick mode gives it
    )
)
register(
    Workload(
        name="io",
        description="~5 ms waiting (remote storage) + ~0.5 ms CPU per sample",
        make_dataset=_io,
        batch_size=32,
        ideal_note=(
            "CPU limit: usable cores / single-process CPU seconds per sample; the ~5 ms wait "
            "costs no CPU, so enough concurrent fetches can hide it and reach this limit"
        ),
    )
)
register(
    Workload(
        name="memory",
        description="3M Python path strings (1M with --quick) read at random: copy-on-read growth",
        make_dataset=_memory,
        batch_size=256,
        samples_per_run=200_000,
    )
)
register(
    Workload(
        name="epochs",
        description="first-batch latency of each of 3 epochs (persistent vs fresh workers)",
        make_dataset=_epochs,
        batch_size=64,
        mode="epochs",
        epochs=3,
    )
)
