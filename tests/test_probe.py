"""backend="auto": the probe picks threads for GIL-free loading, processes otherwise, and
never hangs in its forked child (a parent that used torch's OpenMP pool once deadlocked it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from stoker._probe import choose_backend, choose_backend_isolated


class Sleepy(Dataset):
    """Waits without holding the GIL (I/O-like)."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> int:
        import time

        time.sleep(0.002)
        return i


class PurePython(Dataset):
    """Holds the GIL."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> int:
        return sum(range(20_000)) + i


def _fetch(ds: Dataset) -> object:
    return _MapDatasetFetcher(ds, True, default_collate, False).fetch


class GilFreeCompute(Dataset):
    """CPU work that releases the GIL (like decoding): processes, not threads."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> object:
        import torch

        x = torch.full((256, 256), float(i))
        return (x @ x).sum()


def test_waiting_loading_gets_threads_and_cpu_work_gets_processes():
    backend, why = choose_backend(Sleepy(), _fetch(Sleepy()), 4, iterable=False)
    assert backend == "thread" and "mostly waits" in why
    backend, why = choose_backend(PurePython(), _fetch(PurePython()), 4, iterable=False)
    assert backend == "process" and "CPU work" in why
    ds = GilFreeCompute()
    backend, why = choose_backend(ds, _fetch(ds), 4, iterable=False)
    assert backend == "process" and "CPU work" in why


def test_iterable_datasets_get_processes_without_probing():
    assert choose_backend_isolated(Sleepy(), None, 4, iterable=True)[0] == "process"


def test_probe_child_does_not_hang_after_the_parent_used_openmp():
    """The bench's situation: torch loaders ran here (OpenMP pool live), a thread samples
    memory, then a loader with ``num_workers="auto"`` forks its probe child."""
    script = textwrap.dedent(
        """
        import threading, time
        import psutil, torch, stoker
        from stoker.bench._synthetic import LargeDataset
        from stoker.bench._workloads import consume

        def meter():
            while True:
                psutil.Process().memory_full_info()
                time.sleep(0.05)

        if __name__ == "__main__":
            ds = LargeDataset()
            threading.Thread(target=meter, daemon=True).start()
            for nw in (0, 2):
                it = iter(torch.utils.data.DataLoader(ds, batch_size=64, num_workers=nw))
                for _ in range(3):
                    consume(next(it))
                del it
            loader = stoker.DataLoader(ds, batch_size=64, num_workers="auto")
            consume(next(iter(loader)))
            print(loader.stats().notes[0])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("backend=")
    assert "gave no answer" not in proc.stdout, proc.stdout  # the probe ran, it did not hang
