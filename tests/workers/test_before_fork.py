"""What the main process prepares once before it forks workers, instead of every worker after
the fork: finding the native thread pools each worker caps (OpenMP's, numpy's BLAS), and
numpy's random module, which each worker's first seeding would import."""

from __future__ import annotations

import sys
import types

import pytest
from torch.utils.data import Dataset

import stoker
from stoker.workers import _thread_caps

threadpoolctl = pytest.importorskip("threadpoolctl")
np = pytest.importorskip("numpy")


class PoolThreads(Dataset[dict[str, int]]):
    """Each sample: the threads each native pool of the loading process would use."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, int]:
        return {
            f"{info['user_api']}:{info['filepath']}": int(info["num_threads"])
            for info in threadpoolctl.threadpool_info()
        }


def _pools_here() -> dict[str, int]:
    return PoolThreads()[0]


@pytest.mark.parametrize("start", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_each_workers_native_pools_get_one_thread_and_the_main_process_keeps_its_own(
    start: str,
) -> None:
    np.ones(4) @ np.ones(4)  # numpy's BLAS loaded in the main process
    before = _pools_here()
    if not any(key.startswith("blas:") for key in before):
        pytest.skip("numpy has no BLAS threadpoolctl can drive here")
    loader = stoker.DataLoader(
        PoolThreads(),
        batch_size=None,
        num_workers=2,
        backend="process",
        multiprocessing_context=start,
    )
    seen = list(loader)
    assert len(seen) == 4
    for pools in seen:
        blas = {k: v for k, v in pools.items() if k.startswith("blas:")}
        assert blas, pools  # the worker inherited (or loaded) numpy's BLAS
        assert set(pools.values()) == {1}, pools
    assert _pools_here() == before, "the main process's pools changed"


def test_the_main_process_inspects_again_only_after_an_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_thread_caps, "_modules_seen", -1)
    monkeypatch.setattr(_thread_caps, "_pools", None)
    _thread_caps.inspect_pools()
    first = _thread_caps._pools
    assert isinstance(first, threadpoolctl.ThreadpoolController)
    _thread_caps.inspect_pools()
    assert _thread_caps._pools is first  # nothing imported since: the same inspection
    monkeypatch.setitem(sys.modules, "stoker_test_new_module", types.ModuleType("m"))
    _thread_caps.inspect_pools()
    assert _thread_caps._pools is not first
    assert isinstance(_thread_caps._pools, threadpoolctl.ThreadpoolController)


CHILD = """
import sys
import torch.utils.data as tud
import stoker

class Numbers(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i

print("with stoker:", "numpy.random" in sys.modules)
loader = stoker.DataLoader(Numbers(), batch_size=2, num_workers=1, backend="process")
print(sorted(int(v) for b in loader for v in b))
"""


def test_numpy_random_is_imported_with_stoker_not_in_each_worker() -> None:
    """numpy loads its random module on first use, 26-28 ms of a worker's start: stoker
    imports it (stoker.sampling._seeding), so forked workers share it."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "with stoker: True" in out, out
    assert "[0, 1, 2, 3, 4, 5, 6, 7]" in out, out
