"""Helpers for the loader tests: building either loader, reference orders, deep comparison.

The reference functions reproduce what ``torch.utils.data.DataLoader`` documents and does
(base seed drawn from the generator when an iterator is created, then the sampler; iterable
datasets read round-robin from the workers). The contract suite checks them against torch
itself, so they are verified references, not assumptions.
"""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import stoker

_T_co = TypeVar("_T_co", covariant=True)


class ThreadDataLoader(stoker.DataLoader[_T_co]):
    """stoker's loader with thread workers unless told otherwise: the contract suite runs it
    as a third loader (with workers; the start method does not apply to threads)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("backend", "thread")
        super().__init__(*args, **kwargs)


# Rebuilt from its attributes (as Lightning does), it takes stoker's arguments.
ThreadDataLoader.__init__.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    stoker.DataLoader.__init__
)


LOADERS: dict[str, type[tud.DataLoader[Any]]] = {
    "torch": tud.DataLoader,
    "stoker": stoker.DataLoader,
    "stoker-thread": ThreadDataLoader,
}

# (num_workers, start method) combinations. Spawn costs ~1-2 s per worker start here, so it is
# only used where pickling or process start-up matters.
MAIN = (0, None)
FORK = (2, "fork")
SPAWN = (2, "spawn")


def cases(*modes: tuple[int, str | None]) -> list[Any]:
    """pytest params ``(kind, workers, start)`` for every loader class and the given modes."""
    out = []
    for kind in LOADERS:
        for workers, start in modes:
            if kind == "stoker-thread" and (workers == 0 or start == "spawn"):
                continue  # the same as stoker's in the main process; no processes to spawn
            marks = [pytest.mark.slow] if start == "spawn" else []
            out.append(
                pytest.param(
                    kind, workers, start, id=f"{kind}-{start or 'main'}-w{workers}", marks=marks
                )
            )
    return out


def make_loader(
    kind: str, dataset: Any, workers: int = 0, start: str | None = None, **kwargs: Any
) -> tud.DataLoader[Any]:
    """Build a ``kind`` loader; ``start`` is passed as ``multiprocessing_context`` with workers."""
    if workers > 0 and start is not None:
        kwargs.setdefault("multiprocessing_context", start)
    return LOADERS[kind](dataset, num_workers=workers, **kwargs)


def to_lists(batches: Iterable[Any]) -> list[Any]:
    """Turn each tensor batch into a Python list (for simple equality checks)."""
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in batches]


def chunks(seq: Sequence[Any], size: int, drop_last: bool) -> list[list[Any]]:
    """Split ``seq`` into lists of ``size`` (the last one shorter unless ``drop_last``)."""
    out = [list(seq[i : i + size]) for i in range(0, len(seq), size)]
    if drop_last and out and len(out[-1]) < size:
        out.pop()
    return out


def torch_shuffle_orders(n: int, seed: int, epochs: int, persistent: bool) -> list[list[int]]:
    """The index order torch's DataLoader(shuffle=True, generator=seeded) gives per epoch.

    torch draws one int64 base seed from the generator when it creates an iterator (once for
    persistent workers, every epoch otherwise) and then lets the RandomSampler draw its own.
    """
    g = torch.Generator().manual_seed(seed)
    orders = []
    for epoch in range(epochs):
        if epoch == 0 or not persistent:
            torch.empty((), dtype=torch.int64).random_(generator=g)
        orders.append(list(tud.RandomSampler(range(n), generator=g)))
    return orders


def round_robin(per_worker: Sequence[Sequence[Any]]) -> list[Any]:
    """torch's delivery order for iterable datasets: one item per worker in turn, skipping the
    workers that are exhausted."""
    out = []
    longest = max((len(items) for items in per_worker), default=0)
    for r in range(longest):
        for items in per_worker:
            if r < len(items):
                out.append(items[r])
    return out


def torch_sharded_iterable_batches(
    n: int, workers: int, batch_size: int | None, drop_last: bool
) -> list[Any]:
    """What torch yields for ``ShardedIterable(n)`` (worker ``w`` reads ``range(w, n, W)``)."""
    streams = (
        [list(range(n))] if workers == 0 else [list(range(w, n, workers)) for w in range(workers)]
    )
    if batch_size is None:
        return round_robin(streams)
    return round_robin([chunks(s, batch_size, drop_last) for s in streams])


def assert_same(actual: Any, expected: Any, path: str = "batch") -> None:
    """Deep equality with types, dtypes and shapes (tensors and arrays compared exactly)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert torch.equal(actual, expected), f"{path}: values differ"
        return
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{path}: expected ndarray, got {type(actual)}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert np.array_equal(actual, expected), f"{path}: values differ"
        return
    assert type(actual) is type(expected), f"{path}: type {type(actual)} != {type(expected)}"
    if dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            assert_same(
                getattr(actual, field.name), getattr(expected, field.name), f"{path}.{field.name}"
            )
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def rebuild_like_lightning(loader: tud.DataLoader[Any]) -> tud.DataLoader[Any]:
    """Re-instantiate ``loader`` from its attributes the way Lightning's data connector does.

    Public instance attributes that match ``__init__`` parameters are passed back, the
    multiprocessing context is read through its property, and the sampler is passed instead of
    the default batch sampler.
    """
    attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
    attrs["multiprocessing_context"] = loader.multiprocessing_context
    params = inspect.signature(type(loader).__init__).parameters
    kwargs = {name: attrs[name] for name in params if name != "self" and name in attrs}
    if isinstance(loader.dataset, tud.IterableDataset):
        kwargs.update(sampler=None, batch_sampler=None)
    elif type(loader.batch_sampler) is tud.BatchSampler:
        kwargs.update(sampler=loader.sampler, shuffle=False, batch_sampler=None)
    else:
        kwargs.update(sampler=None, shuffle=False, batch_size=1, drop_last=False)
    return type(loader)(**kwargs)


def iterate_until_error(
    loader: Iterable[Any], exc_type: type[BaseException]
) -> tuple[BaseException, list[Any]]:
    """Iterate ``loader`` until it raises ``exc_type``; return the exception and the batches.

    The traceback's frames are cleared and the iterator dropped before returning, so the
    iterator (and its workers) is released at once by reference counting rather than later by
    the cyclic garbage collector: torch's iterator, collected from a cycle, waits 5 s per
    worker before it terminates them.

    Raises:
        AssertionError: if the loader finishes without raising ``exc_type``.
    """
    seen: list[Any] = []
    it = iter(loader)
    try:
        for batch in it:
            seen.append(batch)
    except exc_type as exc:
        caught = exc
    else:
        raise AssertionError(f"iteration finished without raising {exc_type.__name__}")
    traceback.clear_frames(caught.__traceback__)
    del it
    return caught, seen
