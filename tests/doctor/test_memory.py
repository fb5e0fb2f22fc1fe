"""SK301 (estimated copy-on-read) and SK302 (measured per-worker private-memory growth)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from stoker.doctor import _memory, diagnose
from stoker.doctor._memory import find_containers, measure_worker_growth


class Records(Dataset):
    """Metadata as a list of (path, label) tuples (bad) or numpy arrays (good)."""

    def __init__(self, n: int, compact: bool) -> None:
        paths = [f"/data/img_{i:07d}.jpg" for i in range(n)]
        labels = [i % 100 for i in range(n)]
        if compact:
            self.paths = np.array(paths, dtype=np.bytes_)
            self.labels = np.asarray(labels, dtype=np.int64)
        else:
            self.samples = list(zip(paths, labels, strict=True))
        self.compact = compact

    def __len__(self) -> int:
        return len(self.paths) if self.compact else len(self.samples)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.compact:
            return torch.tensor([len(self.paths[i]), int(self.labels[i])])
        path, label = self.samples[i]
        return torch.tensor([len(path), label])


def test_find_containers_estimates_bytes() -> None:
    ds = Records(20_000, compact=False)
    (c,) = find_containers(ds)
    assert c.path == "dataset.samples" and c.items == 20_000
    assert c.kind == "list of tuple of (str, int)"
    # 20k tuples (~56 B) + their strings (~70 B) + pointers: a few MiB, not KiB or GiB.
    assert 1.5e6 < c.bytes < 6e6


def test_sk301_fires_on_python_lists_and_not_on_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "COPY_WARN_BYTES", 1 * 2**20)
    bad = diagnose(DataLoader(Records(20_000, compact=False), batch_size=8, num_workers=2))
    (f,) = [f for f in bad.findings if f.code == "SK301"]
    assert f.location == "loader.dataset.samples" and "2 workers" in f.observed
    assert "np.array" in f.fix
    good = diagnose(DataLoader(Records(20_000, compact=True), batch_size=8, num_workers=2))
    assert "SK301" not in good.codes


def test_measure_worker_growth_forks_real_workers_and_cleans_up() -> None:
    results = measure_worker_growth(Records(2_000, compact=True), workers=2, samples=500)
    assert len(results) == 2
    assert all(growth >= 0 and read > 0 for growth, read in results)


def test_measurement_reports_a_failing_sample() -> None:
    class Broken(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            raise KeyError(i)

    with pytest.raises(RuntimeError, match="KeyError"):
        measure_worker_growth(Broken(), workers=1)


def test_sk302_measured_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    # Reading a tuple writes its reference count: the pages of the list get copied.
    # Measured here: 40,000 tuples read per worker copy ~13-15 MiB; the arrays ~4 MiB (tensor
    # allocations). The threshold sits between.
    monkeypatch.setattr(_memory, "COPY_WARN_BYTES", 8 * 2**20)
    monkeypatch.setattr(_memory, "MEASURE_SAMPLES", 40_000)
    monkeypatch.setattr(_memory, "MEASURE_READ_S", 30.0)
    bad = diagnose(Records(200_000, compact=False), measure_memory=True)
    assert "SK302" in bad.codes, bad.facts["measured_worker_growth"]
    good = diagnose(Records(200_000, compact=True), measure_memory=True)
    assert "SK302" not in good.codes, good.facts["measured_worker_growth"]
    assert len(good.facts["measured_worker_growth"]) == _memory.MEASURE_WORKERS
