"""Datasets, samplers, collate functions and worker_init_fns for the loader tests.

Everything here is defined at module level so that it pickles by reference and works under
every start method (spawn children import this module by name: pytest puts this directory on
``sys.path`` and spawn hands ``sys.path`` to its children). The datasets report what they see
inside the worker (worker info, pid, RNG draws, epoch) so the tests assert behaviour, not
internals.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import signal
import threading
import time
import warnings
from collections import namedtuple
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info
from torch.utils.data._utils.collate import default_collate

from stoker.workers._loop import WorkerSpec
from stoker.workers._threads import ThreadPool

# Seconds a deliberately slow sample sleeps. Long against a normal fetch (microseconds), short
# enough that a test waiting for it stays quick.
SLOW_SAMPLE_S = 1.0
# Seconds a sample sleeps in the timeout tests: longer than the loader's `timeout`.
HANG_SAMPLE_S = 2.0
# Longest a gated sample waits for its gate file before giving up and loading anyway.
GATE_TIMEOUT_S = 30.0
# How often a gated sample looks for its gate file.
GATE_POLL_S = 0.01


class SampleError(Exception):
    """A user-defined exception type raised from ``__getitem__`` (its type must survive)."""


# -- map-style datasets ------------------------------------------------------------------------


class RangeDataset(Dataset[int]):
    """``ds[i] == i`` for ``i`` in ``range(n)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(index)
        return index


class InfoDataset(Dataset[dict[str, Any]]):
    """Each sample reports the ``get_worker_info()`` seen while fetching it."""

    def __init__(self, n: int, tag: str = "info") -> None:
        self.n = n
        self.tag = tag
        self.init_seed: int | None = None
        self.init_worker_id: int | None = None
        self.init_calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        info = get_worker_info()
        if info is None:
            return {"index": index, "in_worker": False, "pid": os.getpid()}
        return {
            "index": index,
            "in_worker": True,
            "pid": os.getpid(),
            "thread": threading.get_ident(),
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "seed_is_int": type(info.seed) is int,
            "dataset_is_self": info.dataset is self,
            "dataset_type": type(info.dataset).__name__,
            "dataset_tag": getattr(info.dataset, "tag", None),
            "init_seed": self.init_seed,
            "init_worker_id": self.init_worker_id,
            "init_calls": self.init_calls,
            "num_threads": torch.get_num_threads(),
            "gc_freeze_count": gc.get_freeze_count(),
        }


def record_worker_init(worker_id: int) -> None:
    """worker_init_fn: note the worker id, its RNG seed and the call count on the worker's copy."""
    info = get_worker_info()
    assert info is not None, "worker_init_fn ran outside a worker"
    ds = info.dataset
    ds.init_seed = torch.initial_seed()
    ds.init_worker_id = worker_id
    ds.init_calls += 1


def failing_worker_init(worker_id: int) -> None:
    """worker_init_fn that always fails."""
    raise SampleError(f"worker_init_fn refused worker {worker_id}")


class RandomAugDataset(Dataset[tuple[int, float, float, float]]):
    """A sample is its index plus one draw from torch, ``random`` and numpy (an "augmentation")."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, float, float, float]:
        return (
            index,
            float(torch.rand(()).item()),
            random.random(),
            float(np.random.random()),
        )


class SeedReportDataset(RandomAugDataset):
    """A sample is its index, ``torch.initial_seed()`` and one draw from torch, ``random``
    and numpy."""

    def __getitem__(self, index: int) -> tuple[int, float, float, float]:
        return (index, torch.initial_seed(), *super().__getitem__(index)[1:])  # type: ignore[return-value]


# What `reseeding_worker_init` seeds torch with.
USER_SEED = 12345


def reseeding_worker_init(worker_id: int) -> None:
    """worker_init_fn: seed every global generator with a fixed seed (the same in every
    worker, as a user fixing "the" seed writes it)."""
    torch.manual_seed(USER_SEED)
    random.seed(USER_SEED + 1)
    np.random.seed(USER_SEED + 2)


def drawing_worker_init(worker_id: int) -> None:
    """worker_init_fn: draw from every global generator without reseeding (a shard shuffle)."""
    torch.rand(3)
    random.shuffle(list(range(10)))
    np.random.permutation(10)


class NestedDataset(Dataset[torch.Tensor]):
    """Sample ``i`` is a nested tensor of two rows: ``[i, ..., 2i]`` and ``[-i]``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        rows = [torch.arange(index, 2 * index + 1.0), torch.tensor([-float(index)])]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "nested tensors are a prototype"
            return torch.nested.nested_tensor(rows)

    @staticmethod
    def rows(index: int) -> list[list[float]]:
        return [[float(v) for v in range(index, 2 * index + 1)], [-float(index)]]


def nested_collate(samples: list[torch.Tensor]) -> torch.Tensor:
    """Collate nested samples into one nested tensor of all their rows (torch's default
    collate refuses nested tensors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor([row for s in samples for row in s.unbind()])


class SlowDataset(Dataset[int]):
    """``ds[i] == i``; indices in ``slow`` sleep ``delay`` seconds first."""

    def __init__(self, n: int, slow: Sequence[int], delay: float = SLOW_SAMPLE_S) -> None:
        self.n = n
        self.slow = frozenset(slow)
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index in self.slow:
            time.sleep(self.delay)
        return index


class GatedDataset(Dataset[int]):
    """``ds[i] == i``; indices in ``gated`` wait until the file ``gate`` exists.

    Lets a test hold one sample back until the main process has seen another batch, without
    relying on timing (the wait gives up after ``GATE_TIMEOUT_S`` so a broken loader fails
    instead of hanging).
    """

    def __init__(self, n: int, gated: Sequence[int], gate: str) -> None:
        self.n = n
        self.gated = frozenset(gated)
        self.gate = gate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index in self.gated:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(GATE_POLL_S)
        return index


class FailingDataset(Dataset[int]):
    """``ds[i] == i`` except ``ds[bad]``, which raises ``exc_type`` naming index, worker and pid."""

    def __init__(self, n: int, bad: int, exc_type: type[Exception] = SampleError) -> None:
        self.n = n
        self.bad = bad
        self.exc_type = exc_type

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            info = get_worker_info()
            wid = info.id if info is not None else -1
            raise self.exc_type(f"sample {index} is corrupt (worker={wid} pid={os.getpid()})")
        return index


class GetitemsDataset(Dataset[tuple[str, int]]):
    """Defines ``__getitems__``; every sample says which method fetched it and with what batch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[str, int, tuple[int, ...]]:
        return ("getitem", index, ())

    def __getitems__(self, indices: list[int]) -> list[tuple[str, int, tuple[int, ...]]]:
        batch = tuple(indices)
        return [("getitems", i, batch) for i in indices]


class EpochDataset(Dataset[tuple[int, int, int]]):
    """A sample is ``(index, epoch the dataset copy believes it is, pid)``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        return (index, self.epoch, os.getpid())


class EpochSampler(Sampler[int]):
    """Sequential sampler that records the epochs announced to it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


Pair = namedtuple("Pair", ["tensor", "number"])


@dataclasses.dataclass
class Record:
    """A dataclass sample (default_collate does not know dataclasses: see ``record_collate``)."""

    image: torch.Tensor
    mask: np.ndarray
    label: int
    name: str


class RichDataset(Dataset[dict[str, Any]]):
    """Samples mixing tensors of many dtypes/shapes, numpy arrays, strings, ints and containers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(index)
        image = torch.rand(3, 8, 5, generator=g)
        return {
            "image": image,
            "transposed": image.transpose(0, 2),  # non-contiguous
            "scalar": torch.tensor(index * 1.5, dtype=torch.float64),
            "half": torch.full((4,), index, dtype=torch.float16),
            "flags": torch.tensor([index % 2 == 0, True, False]),
            "bytes": torch.arange(index, index + 6, dtype=torch.uint8),
            "empty": torch.zeros(0, 3, dtype=torch.int16),
            "array": np.arange(index, index + 12, dtype=np.int32).reshape(3, 4),
            "farray": np.full((2, 2), index / 7, dtype=np.float64),
            "name": f"sample-{index}",
            "label": index,
            "weight": index / 3,
            "pair": Pair(torch.full((2,), float(index)), index * 10),
            "nested": [(torch.tensor([index, -index]), f"n{index}"), {"deep": np.int64(index)}],
        }


class RecordDataset(Dataset[Record]):
    """Samples are :class:`Record` dataclasses."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Record:
        return Record(
            image=torch.full((2, 3), float(index)),
            mask=np.full((3,), index % 3, dtype=np.uint8),
            label=index,
            name=f"r{index}",
        )


def record_collate(batch: list[Record]) -> Record:
    """Collate dataclass samples into one dataclass of stacked tensors and arrays."""
    return Record(
        image=torch.stack([r.image for r in batch]),
        mask=np.stack([r.mask for r in batch]),
        label=sum(r.label for r in batch),
        name=",".join(r.name for r in batch),
    )


class GrowingDataset(Dataset[torch.Tensor]):
    """Variable-length samples; later samples are much larger than earlier ones."""

    def __init__(self, n: int, base: int = 1000) -> None:
        self.n = n
        self.base = base

    def __len__(self) -> int:
        return self.n

    def length(self, index: int) -> int:
        return self.base * (index + 1) ** 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.arange(self.length(index), dtype=torch.float32) + index


def concat_collate(batch: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Concatenate variable-length samples and keep their lengths."""
    return {
        "values": torch.cat(batch),
        "lengths": torch.tensor([len(t) for t in batch]),
    }


class FilledDataset(Dataset[dict[str, Any]]):
    """``ds[i]`` is a float image and a numpy array filled with ``i`` (easy to verify later)."""

    def __init__(self, n: int, shape: tuple[int, ...] = (3, 16, 16)) -> None:
        self.n = n
        self.shape = shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "x": torch.full(self.shape, float(index)),
            "a": np.full((7,), index, dtype=np.int64),
            "i": index,
        }


def numpy_keeping_collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors into a tensor and arrays into a numpy array (not converted to tensors)."""
    return {
        "x": torch.stack([s["x"] for s in batch]),
        "a": np.stack([s["a"] for s in batch]),
        "i": [s["i"] for s in batch],
    }


# -- iterable datasets -------------------------------------------------------------------------


class ShardedIterable(IterableDataset[int]):
    """Yields ``range(n)``, split between workers by ``get_worker_info()`` (i::num_workers)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


class UnshardedIterable(IterableDataset[int]):
    """Yields ``range(n)`` in every worker (torch's documented duplicate-data pitfall)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


class RangeIterable(IterableDataset[int]):
    """Yields ``range(start, end)``; ``split_range_worker_init`` narrows it per worker."""

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))


def split_range_worker_init(worker_id: int) -> None:
    """torch's documented pattern: configure the worker's dataset copy in worker_init_fn."""
    info = get_worker_info()
    assert info is not None
    ds = info.dataset
    overall_start, overall_end = ds.start, ds.end
    per_worker = -(-(overall_end - overall_start) // info.num_workers)
    ds.start = overall_start + worker_id * per_worker
    ds.end = min(ds.start + per_worker, overall_end)


# -- samplers and batch samplers --------------------------------------------------------------


class ReverseSampler(Sampler[int]):
    """Yields ``n-1, ..., 0``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n - 1, -1, -1))


class GrowingBatchSampler(Sampler[list[int]]):
    """Batches of sizes 1, 2, 3, ... over a permutation of ``range(n)`` (variable batch sizes)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.order = [(i * 7) % n for i in range(n)] if n % 7 else list(range(n))

    def batches(self) -> list[list[int]]:
        out, pos, size = [], 0, 1
        while pos < self.n:
            out.append(self.order[pos : pos + size])
            pos += size
            size += 1
        return out

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())


# -- collate functions -------------------------------------------------------------------------


def identity_collate(batch: Any) -> Any:
    """Return the list of samples unchanged (no tensor conversion)."""
    return batch


def tagging_collate(batch: list[int]) -> dict[str, Any]:
    """A custom collate whose output says it ran."""
    return {"collated_by": "tagging_collate", "items": list(batch), "sum": sum(batch)}


def failing_collate(batch: list[Any]) -> Any:
    """A collate_fn that always fails."""
    raise SampleError(f"collate_fn refused a batch of {len(batch)}")


class GatedStreams(IterableDataset[int]):
    """Worker ``w`` of two yields ``range(w * n, (w + 1) * n)``; worker 0's first item waits
    until worker 1's stream has ended (it then creates the file ``gate``), so worker 0 is stuck
    on a slow item for as long as worker 1 has items to give, without relying on timing (the
    wait gives up after ``GATE_TIMEOUT_S``)."""

    def __init__(self, n: int, gate: str) -> None:
        self.n = n
        self.gate = gate

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        for i in range(worker * self.n, (worker + 1) * self.n):
            if i == 0:
                deadline = time.monotonic() + GATE_TIMEOUT_S
                while not os.path.exists(self.gate) and time.monotonic() < deadline:
                    time.sleep(GATE_POLL_S)
            yield i
        if worker == 1:
            with open(self.gate, "w"):
                pass


class SelfKillingDataset(Dataset[int]):
    """``ds[i] == i``; loading index ``victim`` writes the worker's pid to ``pid_file`` and
    kills the worker with SIGKILL."""

    def __init__(self, n: int, victim: int, pid_file: str) -> None:
        self.n = n
        self.victim = victim
        self.pid_file = pid_file

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.victim:
            with open(self.pid_file, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return index


class EventGatedDataset(Dataset[int]):
    """Samples ``gated`` (every one by default) wait until ``gate`` is set: a worker stays
    inside a batch as long as a test needs."""

    def __init__(self, n: int = 64, gated: Sequence[int] | None = None) -> None:
        self.n = n
        self.gated = set(range(n) if gated is None else gated)
        self.gate = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.gated:
            self.gate.wait()
        return i


def thread_pool(dataset: Any, workers: int = 1) -> ThreadPool:
    """A real :class:`stoker.workers._threads.ThreadPool` over a map-style ``dataset``."""
    return ThreadPool(
        [
            WorkerSpec(
                i, workers, i, "", "", 0, 1, iterable=False, auto_collation=True, drop_last=False
            )
            for i in range(workers)
        ],
        (dataset, default_collate, None),
    )
