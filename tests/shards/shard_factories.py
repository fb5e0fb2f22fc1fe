"""Dataset factories for `stoker pack module:factory` tests (imported by name in subprocesses)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

# Seconds each sample of `slow_dataset` takes; the kill test sets it through the environment.
SLOW_SAMPLE_S = float(os.environ.get("STOKER_TEST_SAMPLE_S", "0"))
SAMPLES = int(os.environ.get("STOKER_TEST_SAMPLES", "40"))


class FieldsDataset:
    """Samples of every field type WebDataset knows, deterministic in the index."""

    def __init__(self, n: int, sleep_s: float = 0.0) -> None:
        self.n = n
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        rng = np.random.default_rng(i)
        return {
            "npy": rng.standard_normal((3, 1 + i % 4)).astype(np.float32),
            "cls": i % 7,
            "json": {"i": i, "name": f"sample {i}"},
            "txt": f"caption {i} " * (1 + i % 50),
            "png": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8),
            "bin": rng.bytes(int(rng.integers(0, 3000))),
        }


def fields_dataset() -> FieldsDataset:
    return FieldsDataset(SAMPLES)


def slow_dataset() -> FieldsDataset:
    return FieldsDataset(SAMPLES, SLOW_SAMPLE_S)


class TupleDataset:
    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return np.full((4, 4, 3), i * 10, dtype=np.uint8), i


def tuple_dataset() -> TupleDataset:
    return TupleDataset()


class DyingDataset(FieldsDataset):
    """Sample ``dies_at`` kills the pack worker loading it (as the out-of-memory killer would);
    in the process that made the dataset it loads as usual."""

    def __init__(self, n: int, dies_at: int = 25) -> None:
        super().__init__(n)
        self.owner = os.getpid()
        self.dies_at = dies_at

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.dies_at and os.getpid() != self.owner:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def dying_dataset() -> DyingDataset:
    return DyingDataset(SAMPLES)


def dying_first_dataset() -> DyingDataset:
    """Dies before any shard is complete: the state file must still allow `--resume`."""
    return DyingDataset(SAMPLES, dies_at=0)
