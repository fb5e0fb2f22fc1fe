"""Datasets, collate functions and worker hooks that fail in controlled, reproducible ways.

Every object here is defined at module level, so it pickles by reference (spawn, forkserver)
as well as it is inherited (fork). Each returns samples that carry their own index, so a test
can count exactly which samples arrived.

A fault that must happen once per run (a worker killing itself) leaves a marker file first:
the respawned worker that loads the same sample again sees the marker and loads it normally.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.utils.data as tud
from PIL import Image

__all__ = [
    "BLOCK_POLL_S",
    "BlockingDataset",
    "DieOnceDataset",
    "FailingCollate",
    "FailingDataset",
    "FailingIterable",
    "FailingWorkerInit",
    "JpegFolder",
    "RandomDataset",
    "SampleError",
    "SlowDataset",
    "block_forever",
    "corrupt_bitflip",
    "corrupt_truncate",
    "indices_of",
    "write_jpegs",
]

# How often a blocked `__getitem__` wakes up (it never returns; the wake-up only keeps it
# interruptible by signals handled in Python).
BLOCK_POLL_S = 0.05
Death = Literal["SIGKILL", "SIGSEGV", "SIGBUS", "SIGTERM"]


class SampleError(ValueError):
    """What the failing datasets raise; its message names the index."""


# -- plain data ------------------------------------------------------------------------------


class RandomDataset(tud.Dataset[tuple[int, int]]):
    """Sample ``i`` is ``(i, r)`` with ``r`` drawn from torch's RNG: it checks seeding too.

    Args:
        n: number of samples.
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        return int(i), int(torch.randint(0, 2**31 - 1, ()).item())


def indices_of(batches: Iterable[Any]) -> list[int]:
    """Flatten the sample indices carried by batches of ``(index, ...)`` samples."""
    out: list[int] = []
    for batch in batches:
        first = batch[0] if isinstance(batch, (list, tuple)) else batch
        out.extend(int(v) for v in torch.as_tensor(first).reshape(-1).tolist())
    return out


# -- exceptions ------------------------------------------------------------------------------


class FailingDataset(tud.Dataset[tuple[int, int]]):
    """Raises :class:`SampleError` in ``__getitem__`` for the indices in ``bad``.

    Args:
        n: number of samples.
        bad: indices that always fail.
        slow: indices that take ``delay`` seconds first (to make a worker finish last).
        delay: seconds.
    """

    def __init__(
        self, n: int, bad: Iterable[int], slow: Iterable[int] = (), delay: float = 0.0
    ) -> None:
        self.n = n
        self.bad = frozenset(bad)
        self.slow = frozenset(slow)
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        if i in self.slow:
            time.sleep(self.delay)
        if i in self.bad:
            raise SampleError(f"sample {i} is bad")
        return int(i), int(i) * 10


class FailingCollate:
    """A ``collate_fn`` that raises for any batch holding one of ``bad`` (else torch's).

    Args:
        bad: sample indices whose batch fails to collate.
    """

    def __init__(self, bad: Iterable[int]) -> None:
        self.bad = frozenset(bad)

    def __call__(self, samples: list[Any]) -> Any:
        hit = sorted(int(s[0]) for s in samples if int(s[0]) in self.bad)
        if hit:
            raise SampleError(f"cannot collate a batch holding samples {hit}")
        return tud.default_collate(samples)


class FailingWorkerInit:
    """A ``worker_init_fn`` that raises in worker ``worker`` (every worker when None).

    Args:
        worker: the worker that fails, or None for all.
        delay_s: seconds the failing call takes before raising (a slow connection attempt).
    """

    def __init__(self, worker: int | None = None, delay_s: float = 0.0) -> None:
        self.worker = worker
        self.delay_s = delay_s

    def __call__(self, worker_id: int) -> None:
        if self.worker is None or worker_id == self.worker:
            time.sleep(self.delay_s)
            raise SampleError(f"worker_init_fn refuses worker {worker_id}")


class FailingIterable(tud.IterableDataset[int]):
    """Each worker yields its share of ``range(n)``; ``__iter__`` raises in ``fail_worker``.

    Args:
        n: number of items in all.
        fail_worker: the worker whose ``__iter__`` raises (with ``num_workers=0``: 0).
        after: items that worker yields before raising (0: ``__iter__`` raises at once).
    """

    def __init__(self, n: int, fail_worker: int, after: int = 0) -> None:
        self.n = n
        self.fail_worker = fail_worker
        self.after = after

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if wid == self.fail_worker and self.after == 0:
            raise SampleError(f"__iter__ of worker {wid} cannot open its stream")
        return self._items(wid, nw)

    def _items(self, wid: int, nw: int) -> Iterator[int]:
        for k, i in enumerate(range(wid, self.n, nw)):
            if wid == self.fail_worker and k == self.after:
                raise SampleError(f"stream of worker {wid} broke after {k} items")
            yield i


class FlakyStream(tud.IterableDataset[int]):
    """Each worker's share of ``range(n)`` from an iterator object whose ``__next__`` raises
    for the items in ``bad`` and goes on after (a reader that skips a corrupt record; a
    generator could not: Python ends it when it raises).

    Args:
        n: number of items in all.
        bad: items that raise instead of being returned.
    """

    def __init__(self, n: int, bad: Iterable[int]) -> None:
        self.n = n
        self.bad = frozenset(bad)
        self._items: Iterator[int] = iter(())

    def __iter__(self) -> FlakyStream:
        info = tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        self._items = iter(range(wid, self.n, nw))
        return self

    def __next__(self) -> int:
        i = next(self._items)
        if i in self.bad:
            raise SampleError(f"record {i} is corrupt")
        return i


# -- deaths ----------------------------------------------------------------------------------


def _segfault() -> None:
    ctypes.string_at(0)  # a real invalid read in native code


def _bus_error() -> None:
    """A real SIGBUS: touch a mapped page past the end of a shrunken file (as a full tmpfs)."""
    with tempfile.TemporaryFile() as f:
        f.truncate(mmap.PAGESIZE * 2)
        m = mmap.mmap(f.fileno(), mmap.PAGESIZE * 2)
        f.truncate(0)
        m[mmap.PAGESIZE]


def die(how: Death) -> None:
    """End the calling process the way ``how`` names (natively for SIGSEGV and SIGBUS)."""
    if how == "SIGSEGV":
        _segfault()
    elif how == "SIGBUS":
        _bus_error()
    os.kill(os.getpid(), getattr(signal, how))
    time.sleep(10)  # the signal is delivered before this returns


class DieOnceDataset(tud.Dataset[tuple[int, int]]):
    """Sample ``i`` is ``(i, r)`` like :class:`RandomDataset`, but loading ``at`` kills the
    worker once (a marker file in ``marker_dir`` records that it happened).

    Args:
        n: number of samples.
        at: indices whose loading kills the worker (each once).
        how: the signal: ``"SIGKILL"`` (as the OOM killer), ``"SIGSEGV"`` (a native null
            read), ``"SIGBUS"`` (touching a truncated mapping) or ``"SIGTERM"``.
        marker_dir: where the markers go (a test's ``tmp_path``).
        always: die every time (no marker).
    """

    def __init__(
        self,
        n: int,
        at: Iterable[int],
        how: Death,
        marker_dir: str | Path,
        always: bool = False,
    ) -> None:
        self.n = n
        self.at = frozenset(at)
        self.how = how
        self.marker_dir = str(marker_dir)
        self.always = always

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        if i in self.at and tud.get_worker_info() is not None:
            marker = os.path.join(self.marker_dir, f"died-at-{i}")
            if self.always or not os.path.exists(marker):
                with open(marker, "w") as f:
                    f.write(f"{os.getpid()} {time.time()}")
                die(self.how)
        return int(i), int(torch.randint(0, 2**31 - 1, ()).item())

    def deaths(self) -> dict[int, tuple[int, float]]:
        """``{index: (pid, time.time())}`` of every death so far (the last one per index)."""
        out = {}
        for p in Path(self.marker_dir).glob("died-at-*"):
            pid, when = p.read_text().split()
            out[int(p.name.removeprefix("died-at-"))] = (int(pid), float(when))
        return out


# -- hangs and slowness ----------------------------------------------------------------------


def block_forever(i: int) -> None:
    """Block the calling thread for good (the name shows up in hang reports)."""
    event = threading.Event()
    while not event.wait(BLOCK_POLL_S):
        pass


class BlockingDataset(tud.Dataset[tuple[int, int]]):
    """Loading any index in ``at`` blocks forever (in :func:`block_forever`).

    Args:
        n: number of samples.
        at: indices that block.
        ready_dir: if set, a file ``blocked-<pid>`` is written there just before blocking.
    """

    def __init__(self, n: int, at: Iterable[int], ready_dir: str | Path | None = None) -> None:
        self.n = n
        self.at = frozenset(at)
        self.ready_dir = None if ready_dir is None else str(ready_dir)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        if i in self.at:
            if self.ready_dir is not None:
                Path(self.ready_dir, f"blocked-{os.getpid()}").write_text(str(i))
            block_forever(i)
        return int(i), int(i) * 10


class SlowDataset(tud.Dataset[tuple[int, int]]):
    """Every sample takes ``delay_s`` seconds (sleeping, so the worker stays responsive).

    Args:
        n: number of samples.
        delay_s: seconds per sample.
    """

    def __init__(self, n: int, delay_s: float) -> None:
        self.n = n
        self.delay_s = delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        time.sleep(self.delay_s)
        return int(i), int(i) * 10


# -- corrupt JPEG files ----------------------------------------------------------------------


def write_jpegs(directory: str | Path, n: int, size: int = 32) -> list[Path]:
    """Write ``n`` distinct small JPEG files ``img-00000.jpg`` ... and return their paths."""
    out = []
    rng = np.random.default_rng(1234)
    for i in range(n):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        pixels[0, 0] = (i % 256, i // 256, 7)
        path = Path(directory, f"img-{i:05d}.jpg")
        Image.fromarray(pixels).save(path, format="JPEG", quality=90)
        out.append(path)
    return out


def corrupt_truncate(path: Path, keep: float = 0.5) -> None:
    """Cut the file after ``keep`` of its bytes (a partial download, a full disk)."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def corrupt_bitflip(path: Path) -> None:
    """Flip one bit of the start-of-image marker (a flipped bit on disk or in transit).

    A flip in the entropy-coded scan usually decodes to wrong pixels without an error, so the
    flip hits the header, which the decoder must parse.
    """
    data = bytearray(path.read_bytes())
    data[1] ^= 0x01  # FF D8 (start of image) -> FF D9 (end of image)
    path.write_bytes(bytes(data))


class JpegFolder(tud.Dataset[tuple[int, torch.Tensor]]):
    """Decodes JPEG files with Pillow: sample ``i`` is ``(i, HxWx3 uint8 tensor)``.

    Args:
        paths: the files, in index order.
    """

    def __init__(self, paths: Sequence[str | Path]) -> None:
        self.paths = [str(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        with Image.open(self.paths[i]) as img:
            pixels = np.asarray(img.convert("RGB"))
        return int(i), torch.from_numpy(pixels.copy())
