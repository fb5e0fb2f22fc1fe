"""backend="auto": the probe picks threads for loading that waits, the main process for
batches cheaper than a worker hand-off and for datasets forked workers would copy, processes
otherwise, and never hangs in its forked child (a parent that used torch's OpenMP pool once
deadlocked it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate

from _machine import measures_the_machine
from stoker.autotune._backend_rule import early_samples, settled
from stoker.autotune._probe import choose_backend, choose_backend_isolated
from stoker.autotune._probe_passes import serial_pass


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


class GilFreeCompute(Dataset):
    """CPU work that releases the GIL (like decoding): processes, not threads."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> object:
        import torch

        x = torch.full((256, 256), float(i))
        return (x @ x).sum()


class TailedNumpy(Dataset):
    """numpy work that releases the GIL, and 1 sample in 4 waits 20 ms: a heavy tail."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> object:
        import time

        import numpy as np

        if i % 4 == 0:
            time.sleep(0.02)
        return float(np.sin(np.arange(200_000, dtype=np.float64) + i).sum())


class TailedPython(Dataset):
    """About 2 ms holding the GIL, and 1 sample in 4 waits 5 ms: threads take turns."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> int:
        import time

        if i % 4 == 0:
            time.sleep(0.005)
        return sum(range(100_000)) + i


class Cheap(Dataset):
    """A sample costs well under a microsecond."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> int:
        return i


class Paths(Dataset):
    """600k path strings in a list: forked workers copy the pages they read."""

    def __init__(self) -> None:
        self.paths = [f"train/n{i % 1000:08d}/image_{i:09d}.JPEG" for i in range(600_000)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        path = self.paths[i]
        return sum(map(ord, path[-12:]))


@pytest.mark.measures
@measures_the_machine
def test_waiting_loading_gets_threads_and_cpu_work_gets_processes():
    detail: dict[str, object] = {}
    backend, why = choose_backend(Sleepy(), default_collate, 4, iterable=False, detail=detail)
    assert backend == "thread" and "mostly waits" in why
    assert detail["waits"] is True, detail
    for ds in (PurePython(), GilFreeCompute()):  # batches of 16 well above the inline limit
        backend, why = choose_backend(ds, default_collate, 16, iterable=False)
        assert backend == "process" and "CPU work" in why, (type(ds).__name__, why)


@pytest.mark.measures
@measures_the_machine
def test_a_heavy_tail_gets_threads_only_when_the_work_runs_in_parallel_in_them():
    # The waits of a few slow samples need more workers than cores: threads, when two of
    # them load nearly twice as fast as one; GIL-bound work needs processes all the same.
    detail: dict[str, object] = {}
    backend, why = choose_backend(TailedNumpy(), default_collate, 4, iterable=False, detail=detail)
    assert backend == "thread" and "slow samples wait" in why, why
    assert detail["waits"] is True, detail
    backend, why = choose_backend(TailedPython(), default_collate, 4, iterable=False)
    assert backend == "process", why


@pytest.mark.measures
@measures_the_machine
def test_batches_cheaper_than_a_hand_off_load_in_the_main_process_when_allowed():
    backend, why = choose_backend(Cheap(), default_collate, 8, iterable=False)
    assert backend == "inline" and "loads in" in why
    backend, _ = choose_backend(Cheap(), default_collate, 8, iterable=False, allow_inline=False)
    assert backend == "process"


@pytest.mark.measures  # asserts a measured probe decision
def test_a_dataset_forked_workers_would_copy_stays_in_the_main_process():
    ds = Paths()
    backend, why = choose_backend_isolated(ds, default_collate, 256, iterable=False)
    assert backend == "inline" and "copy the dataset" in why and "stoker.compact" in why, why
    # Explicit workers: threads share the dataset instead of copying it.
    backend, why = choose_backend_isolated(
        ds, default_collate, 256, iterable=False, allow_inline=False
    )
    assert backend == "thread" and "copy the dataset" in why, why
    # The same strings made flat (stoker.compact): nothing to copy, so workers are fine.
    import stoker

    ds.paths = stoker.compact(ds.paths)
    backend, why = choose_backend_isolated(ds, default_collate, 256, iterable=False)
    assert "copy the dataset" not in why, why


def test_iterable_datasets_get_processes_without_probing():
    assert choose_backend_isolated(Sleepy(), None, 4, iterable=True)[0] == "process"


@pytest.mark.measures  # asserts a measured probe decision
def test_auto_loader_that_loads_inline_says_why_and_delivers_torchs_batches():
    import torch

    import stoker

    loader = stoker.DataLoader(Cheap(), batch_size=8, num_workers="auto")
    got = [b.tolist() for b in loader]
    assert loader.num_workers == 0
    stats = loader.stats()
    assert stats.backend == "inline" and stats.notes[0].startswith("backend=inline"), stats
    want = [b.tolist() for b in torch.utils.data.DataLoader(Cheap(), batch_size=8)]
    assert got == want


@pytest.mark.measures  # asserts a measured probe decision
def test_an_auto_loader_that_loads_inline_does_not_keep_an_epochs_iterator():
    import gc
    import weakref

    import stoker

    loader = stoker.DataLoader(Cheap(), batch_size=8, num_workers="auto")
    it = iter(loader)
    next(it)
    next(it)  # (the first came from the main process before the probe: the answer is here)
    assert loader.stats().backend == "inline"
    # (the epoch's handle on the persistent iterator its first batch began with, if any)
    first = weakref.ref(getattr(it, "_iterator", it))
    del it
    gc.collect()
    # Nothing holds an abandoned epoch's iterator (its batches loaded ahead, its sampler).
    assert first() is None
    assert len(list(loader)) == -(-len(Cheap()) // 8)


def test_probe_child_does_not_hang_after_the_parent_used_openmp():
    """The bench's situation: torch loaders ran here (OpenMP pool live), a thread samples
    memory, then a loader with ``num_workers="auto"`` forks its probe child (and, its batches
    being slow, the child that loads the first batch beside it)."""
    script = textwrap.dedent(
        """
        import threading, time
        import psutil, torch, stoker
        from stoker.bench._synthetic import LargeDataset
        from stoker._commands.step import consume

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
            it = iter(loader)
            consume(next(it))  # (from the head start: stoker.loader._head)
            consume(next(it))  # the workers started with the probe's answer
            print(loader.stats().notes[0])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("backend=")
    assert "gave no answer" not in proc.stdout, proc.stdout  # the probe ran, it did not hang


@pytest.mark.measures
@measures_the_machine
def test_cheap_cpu_samples_end_the_serial_pass_early() -> None:
    # Plain CPU work shows within a few hundred samples: the pass does not fill its time.
    size = 4
    early = (early_samples(size), settled)
    found = serial_pass(Cheap(), default_collate, size, len(Cheap()), False, 1.0, early)
    assert len(found.walls) == early_samples(size), len(found.walls)
    full = serial_pass(Cheap(), default_collate, size, len(Cheap()), False, 0.05)
    assert len(full.walls) > early_samples(size)


class OnePause(Dataset):
    """Cheap samples, but the 12th read is held up 50 ms (as if another process took the
    core)."""

    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 200  # a full pass reads each once

    def __getitem__(self, i: int) -> int:
        self.reads += 1
        if self.reads == 12:
            import time

            time.sleep(0.05)
        return i


@pytest.mark.measures
@measures_the_machine
def test_one_held_up_sample_does_not_pass_for_the_datasets_cost() -> None:
    # 200 samples of microseconds and one of 50 ms: counted in, a batch of 8 would read 2 ms
    # (above the inline threshold); the slowest 2% are left out of the batch time.
    dataset = OnePause()
    found = serial_pass(dataset, default_collate, 8, len(dataset), False, 1.0, (128, settled))
    assert max(found.walls) >= 0.05
    assert found.batch_s < 1e-3, found.batch_s


class Recorded(Dataset):
    """Records the indices read; each read takes ``pause`` seconds."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.reads: list[int] = []

    def __len__(self) -> int:
        return 1_000

    def __getitem__(self, i: int) -> int:
        if self.pause:
            import time

            time.sleep(self.pause)
        self.reads.append(i)
        return i


@pytest.mark.measures  # the warm-up's length follows the measured clock
def test_the_serial_pass_warms_up_with_a_batch_of_cheap_samples_and_two_slow_ones() -> None:
    # Cheap samples: the first batch is loaded and collated before any sample is timed (a
    # forked child's first allocations copy its parent's pages; that is not the dataset's cost).
    cheap = Recorded()
    collated: list[int] = []

    def collate(batch: list[int]) -> list[int]:
        collated.append(len(batch))
        return batch

    found = serial_pass(cheap, collate, 16, len(cheap), False, 0.05, (64, settled))
    assert collated[0] == 16
    assert len(cheap.reads) == 16 + len(found.walls)
    assert cheap.reads[:16] == cheap.reads[16:32]  # the timed pass starts over the same samples
    # Slow samples: two, as the warm-up's time (WARM_UP_S) is spent by then.
    slow = Recorded(pause=0.006)
    collated.clear()
    found = serial_pass(slow, collate, 16, len(slow), False, 0.05)
    assert collated[0] == 2
    assert len(slow.reads) == 2 + len(found.walls)


def test_a_loader_the_probe_keeps_in_the_main_process_imports_no_worker_controller() -> None:
    """The handover's and the controller's modules are for workers: a first ``iter()`` that
    ends inline must not pay for importing them (16 ms on the 2-core VM)."""
    code = textwrap.dedent(
        """
        import sys
        import torch.utils.data as tud
        import stoker

        class Cheap(tud.Dataset):
            def __len__(self):
                return 10_000

            def __getitem__(self, i):
                return i

        loader = stoker.DataLoader(Cheap(), batch_size=64, num_workers="auto")
        next(iter(loader))
        print(loader.stats().backend)
        print(sorted(m for m in ("stoker.loader._switch", "stoker.autotune._controller")
                     if m in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split("\n")
    if out[0] != "inline":
        pytest.skip(f"the probe chose {out[0]} on this machine")
    assert out[1] == "[]", out
