"""SK401-SK409: checks that read a few samples or look at the running process."""

from __future__ import annotations

import multiprocessing
import socket
import time
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from stoker.doctor import Severity, diagnose
from stoker.doctor._handles import check_cuda_fork
from stoker.doctor._runtime import check_process
from stoker.doctor._subject import subject_of


class Timed(Dataset):
    """Samples cost ``base`` seconds; the indices in ``slow`` cost ``slow_s``."""

    def __init__(self, n: int = 64, slow: frozenset[int] = frozenset(), slow_s: float = 0.03):
        self.n, self.slow, self.slow_s = n, slow, slow_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.slow:
            time.sleep(self.slow_s)
        return torch.full((4,), float(i))


def codes(obj) -> list[str]:
    return diagnose(obj).codes


def test_sk401_latency_tail_is_confirmed_by_rereading() -> None:
    # _indices(64, 16) reads 0, 4, 8, ..., 63: index 42 is one of them.
    bad = diagnose(DataLoader(Timed(slow=frozenset({42})), batch_size=8))
    (f,) = [f for f in bad.findings if f.code == "SK401"]
    assert "median" in f.observed and "in_order=False" in f.fix
    assert "SK401" not in codes(DataLoader(Timed(), batch_size=8))
    # Uniformly slow samples are a cost, not a tail.
    uniform = Timed(n=16, slow=frozenset(range(16)), slow_s=0.006)
    assert "SK401" not in codes(DataLoader(uniform, batch_size=4))


class Pil(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return Image.fromarray(np.zeros((4, 6, 3), dtype=np.uint8)), i


def test_sk402_pil_samples() -> None:
    d = diagnose(DataLoader(Pil(), batch_size=4, collate_fn=list))
    (f,) = [f for f in d.findings if f.code == "SK402"]
    assert f.severity is Severity.WARNING and f.location == "sample[0]"
    assert "6x4 RGB" in f.observed
    # With the default collate the batch fails too: the PIL finding is an error.
    d2 = diagnose(DataLoader(Pil(), batch_size=4))
    assert {"SK402", "SK409"} <= set(d2.codes)
    assert next(f for f in d2.findings if f.code == "SK402").severity is Severity.ERROR
    assert "SK402" not in codes(DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=4))


class Lists(Dataset):
    def __init__(self, as_tensor: bool) -> None:
        self.as_tensor = as_tensor

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        values = [float(j) for j in range(2000)]
        return torch.tensor(values) if self.as_tensor else values


def test_sk403_big_python_lists() -> None:
    d = diagnose(DataLoader(Lists(False), batch_size=2))
    (f,) = [f for f in d.findings if f.code == "SK403"]
    assert "2,000 floats" in f.observed
    assert "SK403" not in codes(DataLoader(Lists(True), batch_size=2))


def slow_collate(batch):
    time.sleep(0.02)
    return torch.stack(batch)


def test_sk404_collate_share() -> None:
    d = diagnose(DataLoader(Timed(n=16), batch_size=8, collate_fn=slow_collate))
    (f,) = [f for f in d.findings if f.code == "SK404"]
    assert "slow_collate" in f.observed and "%" in f.observed
    assert "SK404" not in codes(DataLoader(Timed(n=16), batch_size=8))


class Holder(Dataset):
    def __init__(self, handle=None) -> None:
        self.handle = handle

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(2)


@pytest.mark.parametrize("kind", ["h5py", "lmdb", "file", "socket"])
def test_sk405_handles_opened_before_fork(tmp_path: Path, kind: str) -> None:
    if kind == "h5py":
        with h5py.File(tmp_path / "x.h5", "w") as f:
            f["x"] = np.zeros(4)
        handle = h5py.File(tmp_path / "x.h5", "r")
    elif kind == "lmdb":
        handle = lmdb.open(str(tmp_path / "db"), map_size=2**20)
    elif kind == "file":
        (tmp_path / "f.bin").write_bytes(b"x" * 16)
        handle = open(tmp_path / "f.bin", "rb")
    else:
        handle = socket.socket()
    try:
        loader = DataLoader(
            Holder({"h": handle}), batch_size=2, num_workers=1, multiprocessing_context="fork"
        )
        d = diagnose(loader)
        (f,) = [f for f in d.findings if f.code == "SK405"]
        assert f.location == "loader.dataset.handle['h']"
        expected = Severity.ERROR if kind in ("h5py", "lmdb") else Severity.WARNING
        assert f.severity is expected
        # The same handle is not reported again as a pickling problem under fork.
        assert "SK101" not in d.codes
        # Under spawn it is a pickling error instead.
        spawn = DataLoader(
            Holder({"h": handle}), batch_size=2, num_workers=1, multiprocessing_context="spawn"
        )
        assert "SK405" not in codes(spawn) and "SK101" in codes(spawn)
    finally:
        handle.close()
    assert "SK405" not in codes(DataLoader(Holder(str(tmp_path)), batch_size=2, num_workers=1))


def test_sk406_cuda_before_fork() -> None:
    # No GPU here: driven through its input (torch.cuda.is_initialized() in diagnose).
    (f,) = check_cuda_fork(cuda_initialized=True, start_method="fork", workers=2)
    assert f.code == "SK406" and "spawn" in f.fix
    assert check_cuda_fork(cuda_initialized=True, start_method="spawn", workers=2) == []
    assert check_cuda_fork(cuda_initialized=False, start_method="fork", workers=2) == []
    assert check_cuda_fork(cuda_initialized=True, start_method="fork", workers=0) == []


def _diagnose_in_daemon(conn) -> None:
    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2, num_workers=2)
    conn.send(diagnose(loader).codes)
    conn.close()


def test_sk407_daemonic_process_real() -> None:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_diagnose_in_daemon, args=(child,), daemon=True)
    proc.start()
    child.close()
    try:
        assert parent.poll(60)
        assert "SK407" in parent.recv()
    finally:
        parent.close()
        proc.join(30)
        proc.close()
    assert "SK407" not in codes(
        DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2, num_workers=1)
    )


class MainDataset(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        return i


def test_sk408_jupyter_with_spawn() -> None:
    # Driven through its inputs: the dataset's class is made to look defined in a notebook.
    ds = MainDataset()
    spawn = subject_of(DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn"))
    fork = subject_of(DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="fork"))
    assert check_process(spawn, daemonic=False, jupyter=True) == []  # defined in a module
    original = MainDataset.__module__
    MainDataset.__module__ = "__main__"
    try:
        (f,) = check_process(spawn, daemonic=False, jupyter=True)
        assert f.code == "SK408" and "MainDataset" in f.observed
        assert check_process(fork, daemonic=False, jupyter=True) == []
        assert check_process(spawn, daemonic=False, jupyter=False) == []
    finally:
        MainDataset.__module__ = original


class Broken(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        raise FileNotFoundError(f"/data/{i}.jpg")


def test_sk409_failing_sample_is_reported_not_raised() -> None:
    d = diagnose(DataLoader(Broken(), batch_size=2))
    (f,) = [f for f in d.findings if f.code == "SK409"]
    assert "FileNotFoundError" in f.observed and "index 0" in f.observed


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(100):
            yield torch.full((3,), float(i))


def test_iterable_dataset_and_bare_dataset_and_factory() -> None:
    d = diagnose(DataLoader(Stream(), batch_size=10))
    assert d.codes == [] and d.facts["batch_bytes"] == 10 * 3 * 4
    bare = diagnose(Timed(n=8))
    assert bare.codes == [] and bare.facts["num_workers"] is None
    made = diagnose(lambda: DataLoader(Timed(n=8), batch_size=4))
    assert made.facts["batch_size"] == 4


def test_not_a_loader_is_a_config_error() -> None:
    from stoker.errors import ConfigError

    with pytest.raises(ConfigError, match=r"builtins\.int"):
        diagnose(3)
