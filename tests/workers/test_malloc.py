"""A worker's malloc starts where a long-running process's ends up (glibc's converged
thresholds), unless the user tuned it."""

from __future__ import annotations

import ctypes
import platform

import pytest
from torch.utils.data import Dataset

import stoker
from stoker.workers import _malloc

needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
# Over any threshold a fresh process's imports could have raised glibc's to, under its ceiling.
BUFFER = 30 * 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class MappedBuffers(Dataset[int]):
    """Each sample: whether a fresh buffer of BUFFER bytes got a mapping of its own."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        libc.mallinfo2.restype = _MallInfo2
        before = libc.mallinfo2().hblks
        buffer = libc.malloc(BUFFER)
        mapped = libc.mallinfo2().hblks - before
        libc.free(buffer)
        return int(mapped)


@needs_glibc
@pytest.mark.parametrize(
    ("env", "mapped"),
    [
        ({}, 0),  # settled: served from the heap, kept for the next sample
        ({"STOKER_WORKER_MALLOC": "0"}, 1),  # glibc as it starts: a mapping of its own
        ({"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}, 1),  # the user's threshold stands
    ],
)
def test_a_fresh_worker_serves_large_buffers_from_its_heap_unless_told_otherwise(
    env: dict[str, str], mapped: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    # spawn: a fresh interpreter whose malloc starts from glibc's (and the user's) settings.
    loader = stoker.DataLoader(
        MappedBuffers(), batch_size=None, num_workers=1, multiprocessing_context="spawn"
    )
    assert list(loader) == [mapped]


def test_a_users_tuning_or_the_switch_or_another_libc_leaves_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (*_malloc._USER_TUNING, _malloc.ENV_OFF):
        monkeypatch.delenv(var, raising=False)
    assert _malloc.wanted() is (platform.libc_ver()[0] == "glibc")
    for var in ("MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.setenv(var, "0")
        assert not _malloc.wanted() and not _malloc.settle_malloc()
        monkeypatch.delenv(var)
    monkeypatch.setenv(_malloc.ENV_OFF, "0")
    assert not _malloc.wanted()
    monkeypatch.delenv(_malloc.ENV_OFF)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert not _malloc.wanted()
