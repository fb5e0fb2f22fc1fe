"""SK101 (cannot be pickled for spawn/forkserver workers) and SK102 (large dataset pickle)."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import stoker
from stoker.doctor import Severity, _pickling, diagnose
from stoker.doctor._pickling import locate_unpicklable


def double(x):
    return x * 2


class Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms


class Tiny(Dataset):
    def __init__(self, transform=None, n: int = 8) -> None:
        self.x = torch.arange(n, dtype=torch.float32)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        x = self.x[i]
        return self.transform(x) if self.transform else x


def sk101(d) -> list:
    return [f for f in d.findings if f.code == "SK101"]


def test_names_the_deepest_attribute_path_and_definition_line() -> None:
    ds = Tiny(Compose([double, functools.partial(double), lambda x: x + 1]))
    loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    (finding,) = sk101(diagnose(loader))
    assert finding.location == "loader.dataset.transform.transforms[2]"
    assert finding.severity is Severity.ERROR
    assert "lambda" in finding.observed and "test_pickling.py:" in finding.observed
    assert "'spawn'" in finding.why


def test_is_a_warning_under_fork_and_checks_collate_and_init_fns() -> None:
    def local_collate(batch):
        return torch.stack(batch)

    loader = DataLoader(
        Tiny(),
        batch_size=4,
        num_workers=1,
        multiprocessing_context="fork",
        collate_fn=local_collate,
        worker_init_fn=lambda i: None,
    )
    found = sk101(diagnose(loader))
    assert sorted(f.location for f in found) == ["loader.collate_fn", "loader.worker_init_fn"]
    assert {f.severity for f in found} == {Severity.WARNING}
    assert any("defined inside another function" in f.observed for f in found)


def test_picklable_loader_is_silent_and_records_pickle_size() -> None:
    loader = DataLoader(
        Tiny(
            Compose(
                [
                    double,
                    functools.partial(
                        double,
                    ),
                ]
            )
        ),
        batch_size=4,
        num_workers=1,
        multiprocessing_context="spawn",
    )
    d = diagnose(loader)
    assert sk101(d) == []
    assert d.facts["dataset_pickle_bytes"] > 0


def test_stoker_loader_is_judged_with_cloudpickle() -> None:
    # stoker's process workers pickle with cloudpickle, which handles lambdas.
    ds = Tiny(lambda x: x + 1)
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert sk101(diagnose(loader)) == []
    assert sk101(
        diagnose(DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn"))
    )


def test_locate_returns_none_for_picklable() -> None:
    assert locate_unpicklable({"a": [1, 2, double]}, "x") is None
    path, obj, err = locate_unpicklable({"a": [1, 2, lambda: 0]}, "x")
    assert path == "x['a'][2]" and callable(obj) and err is not None


def test_sk102_large_pickle_under_spawn(monkeypatch) -> None:
    monkeypatch.setattr(_pickling, "LARGE_PICKLE_BYTES", 1024)
    big = Tiny(n=8)
    big.table = np.zeros(4096)  # 32 KiB copied into every worker (tensors go by shm)
    bad = diagnose(DataLoader(big, batch_size=4, num_workers=2, multiprocessing_context="spawn"))
    (finding,) = [f for f in bad.findings if f.code == "SK102"]
    assert "2 workers" in finding.observed
    fork = diagnose(DataLoader(big, batch_size=4, num_workers=2, multiprocessing_context="fork"))
    small = diagnose(
        DataLoader(Tiny(n=8), batch_size=4, num_workers=2, multiprocessing_context="spawn")
    )
    assert "SK102" not in fork.codes and "SK102" not in small.codes
