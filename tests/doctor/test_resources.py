"""SK201-SK205: resource checks, driven through their readings (and the live machine's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from stoker._introspect import platform as _platform
from stoker.doctor import Severity, diagnose
from stoker.doctor._resources import (
    check_cores,
    check_open_files,
    check_pin_memory,
    check_shm,
    check_threads,
    worker_threads,
)

MiB = 2**20


def test_shm_error_warning_and_silence_against_a_real_directory(tmp_path: Path) -> None:
    # The real statvfs of a temporary directory stands in for a container's /dev/shm.
    free = _platform.shm_free_bytes(str(tmp_path))
    assert free > 0
    batch = free // 4  # 2 workers x prefetch 2 x batch = free
    (err,) = check_shm(
        shm_path=str(tmp_path), free_bytes=free, workers=2, prefetch=3, batch_bytes=batch
    )
    assert err.code == "SK201" and err.severity is Severity.ERROR
    assert "2 workers x prefetch 3" in err.observed and str(tmp_path) in err.observed
    assert "--shm-size=" in err.fix
    (warn,) = check_shm(
        shm_path=str(tmp_path), free_bytes=free, workers=2, prefetch=2, batch_bytes=batch * 3 // 4
    )
    assert warn.severity is Severity.WARNING
    assert (
        check_shm(
            shm_path=str(tmp_path), free_bytes=free, workers=2, prefetch=2, batch_bytes=batch // 4
        )
        == []
    )


def test_shm_message_matches_the_house_example() -> None:
    (f,) = check_shm(
        shm_path="/dev/shm", free_bytes=64 * MiB, workers=4, prefetch=2, batch_bytes=38 * MiB
    )
    assert f.observed == (
        "/dev/shm has 64.0 MiB free but 4 workers x prefetch 2 x 38.0 MiB batches need 304.0 MiB"
    )


def test_diagnose_uses_the_given_shm_reading(tmp_path: Path) -> None:
    ds = TensorDataset(torch.zeros(64, 1024))  # 4 KiB per sample, 64 KiB per batch of 16
    loader = DataLoader(ds, batch_size=16, num_workers=1)
    small = diagnose(loader, shm_dir=str(tmp_path), shm_free_bytes=100 * 1024)
    assert "SK201" in small.codes and small.facts["batch_bytes"] == 16 * 4096
    assert "SK201" not in diagnose(loader, shm_dir=str(tmp_path)).codes


def test_cores_counts_ranks_on_the_node() -> None:
    (f,) = check_cores(workers=4, usable=8, cpu_count=64, affinity=8, quota=None, ranks_per_node=4)
    assert f.code == "SK202" and "16 processes for 8 usable cores" in f.observed
    assert "os.cpu_count() 64" in f.observed and "LOCAL_WORLD_SIZE" in f.observed
    (q,) = check_cores(workers=6, usable=2, cpu_count=64, affinity=64, quota=1.5)
    assert "cgroup quota 1.5 cores" in q.observed
    assert (
        check_cores(workers=2, usable=8, cpu_count=64, affinity=8, quota=None, ranks_per_node=4)
        == []
    )


def test_threads_oversubscription() -> None:
    (f,) = check_threads(workers=4, usable=8, threads={"OMP_NUM_THREADS": 8})
    assert f.code == "SK203" and "4 workers x 8 threads (OMP_NUM_THREADS) = 32" in f.observed
    assert check_threads(workers=4, usable=8, threads={"OMP_NUM_THREADS": 1}) == []
    assert check_threads(workers=4, usable=8, threads={}) == []


def test_worker_threads_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    monkeypatch.setenv("MKL_NUM_THREADS", "junk")
    threads = worker_threads()
    assert threads["OMP_NUM_THREADS"] == 6 and "MKL_NUM_THREADS" not in threads


def test_open_files_limit() -> None:
    kw: dict = {"hard_limit": 4096, "open_now": 24, "strategy": "file_descriptor"}
    kw.update(workers=8, prefetch=2)
    (err,) = check_open_files(soft_limit=1024, tensors_per_batch=128, **kw)
    assert err.code == "SK204" and err.severity is Severity.ERROR
    assert "2048 shared-memory file descriptors" in err.observed and "ulimit -n 4096" in err.fix
    (warn,) = check_open_files(soft_limit=1024, tensors_per_batch=40, **kw)
    assert warn.severity is Severity.WARNING
    assert check_open_files(soft_limit=1024, tensors_per_batch=2, **kw) == []
    kw["strategy"] = "file_system"
    assert check_open_files(soft_limit=1024, tensors_per_batch=128, **kw) == []


def test_pin_memory_without_accelerator() -> None:
    (f,) = check_pin_memory(pin_memory=True, accelerator=False)
    assert f.code == "SK205"
    assert check_pin_memory(pin_memory=True, accelerator=True) == []
    assert check_pin_memory(pin_memory=False, accelerator=False) == []


def test_live_machine_readings_are_recorded() -> None:
    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4, num_workers=1)
    facts = diagnose(loader).facts
    assert facts["usable_cores"] == _platform.usable_cores()
    assert facts["cpu_count"] == os.cpu_count()
    assert facts["open_files_soft"] == _platform.open_files_limit()[0]
    assert facts["sharing_strategy"] == torch.multiprocessing.get_sharing_strategy()


def test_shm_finding_for_a_stoker_loader_says_it_spills_and_stays_a_warning() -> None:
    (f,) = check_shm(
        shm_path="/dev/shm",
        free_bytes=64 * MiB,
        workers=4,
        prefetch=2,
        batch_bytes=38 * MiB,
        spill_dir="/tmp",
    )
    assert f.code == "SK201" and f.severity is Severity.WARNING
    assert "/tmp" in f.why and 'shm="require"' in f.why and "--shm-size=" in f.fix


def test_diagnose_of_a_stoker_loader_names_the_spill_unless_shm_is_required(
    tmp_path: Path,
) -> None:
    import stoker

    ds = TensorDataset(torch.zeros(64, 1024))
    for shm, severity in (("auto", Severity.WARNING), ("require", Severity.ERROR)):
        loader = stoker.DataLoader(ds, batch_size=16, num_workers=1, shm=shm)
        report = diagnose(loader, shm_dir=str(tmp_path), shm_free_bytes=100 * 1024)
        (f,) = [f for f in report.findings if f.code == "SK201"]
        assert f.severity is severity, (shm, f)


def test_stoker_slots_count_their_growth_room() -> None:
    """0.5 MiB batches x 2 workers x prefetch 2 on a 4 MiB tmpfs: exactly half for torch's
    exact segments, but stoker's slots are 1.25x their batch and a third of the batches
    spilled; the finding said nothing."""
    args = {"shm_path": "/mnt/shm4", "free_bytes": 4 * MiB, "workers": 2, "prefetch": 2}
    assert check_shm(**args, batch_bytes=MiB // 2) == []
    (f,) = check_shm(**args, batch_bytes=MiB // 2, spill_dir="/tmp", slot_factor=1.25)
    assert f.severity is Severity.WARNING
    assert f.observed == (
        "/mnt/shm4 has 4.0 MiB free but 2 workers x prefetch 2 x 0.5 MiB batches (in slots "
        "1.25x their size) take 2.5 MiB, more than half of it"
    )
