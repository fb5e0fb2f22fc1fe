"""Helpers shared by the measurement scripts."""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch

from stoker._commands.step import consume
from stoker.bench._workloads import Workload, get_workload


def endless_sampler(dataset: Any) -> torch.utils.data.RandomSampler:
    """Random indices with replacement, seeded, effectively without end."""
    return torch.utils.data.RandomSampler(
        dataset, replacement=True, num_samples=10**9, generator=torch.Generator().manual_seed(0)
    )


def rate(
    make: Callable[[], Iterable[Any]], seconds: float, warmup: int = 4, settle: float = 0.0
) -> float:
    """Samples per second of the iterable ``make()`` builds, after ``warmup`` batches and
    at least ``settle`` seconds."""
    loader = make()
    it = iter(loader)
    end = time.perf_counter() + settle
    for _ in range(warmup):
        consume(next(it))
    while time.perf_counter() < end:
        consume(next(it))
    samples = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        samples += consume(next(it))
    result = samples / (time.perf_counter() - t0)
    del it, loader
    return result


def contenders_parser(doc: str) -> argparse.ArgumentParser:
    """A parser for ``WORKLOAD CONTENDER...`` (the script's docstring's first line as its
    description); add the script's own options to it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("contenders", nargs="+")
    return parser


def open_workload(name: str) -> tuple[Workload, Any]:
    """The bench workload called ``name`` and its dataset (torch's warning about more worker
    processes than cores silenced: the scripts compare such configurations on purpose)."""
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    workload = get_workload(name)
    return workload, workload.make_dataset(False)


def contender(
    kind: str, dataset: Any, batch_size: int, sampler: Any, device: str | None = None
) -> Any:
    """A loader named on a script's command line.

    ``auto``: stoker, ``num_workers="auto"`` and ``prefetch_factor="auto"``; ``torchN`` or
    ``torchN:P``: torch's DataLoader, N workers (persistent), ``prefetch_factor`` P (default
    2); ``stokerN``: stoker, N workers; ``process:N`` or ``thread:N``: stoker, N workers of
    that backend; ``auto:thread`` or ``auto:process``: ``num_workers="auto"`` with that
    backend; ``spdlN``: SPDL, N threads; ``torchdataN`` or ``torchdataN:P``: torchdata.nodes,
    N worker processes, prefetch P (default 2), where installed. ``device``: stoker's loaders
    deliver there (``device=``); torch's pin their batches (``pin_memory=True``) for the
    caller to copy; the peers' batches are left as they are.
    """
    import stoker
    from stoker.bench._contenders import ContenderSpec, build_loader

    base, _, rest = kind.partition(":")
    if base == "auto" and rest in ("thread", "process"):
        return stoker.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers="auto",
            backend=cast(Any, rest),  # checked just above
            device=device,
        )
    for library in ("spdl", "torchdata"):
        if base.startswith(library) and base[len(library) :].isdigit():
            prefetch = None if library == "spdl" else int(rest or 2)
            spec = ContenderSpec(library, int(base[len(library) :]), prefetch)
            return build_loader(spec, dataset, batch_size, sampler)
    if kind == "auto":
        return stoker.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers="auto",
            prefetch_factor="auto",
            device=device,
        )
    try:
        if kind.startswith("torch"):
            workers, _, prefetch = kind[len("torch") :].partition(":")
            pin = device is not None
            if int(workers) == 0:
                return torch.utils.data.DataLoader(
                    dataset, batch_size=batch_size, sampler=sampler, pin_memory=pin
                )
            return torch.utils.data.DataLoader(
                dataset,
                batch_size=batch_size,
                sampler=sampler,
                num_workers=int(workers),
                prefetch_factor=int(prefetch or 2),
                persistent_workers=True,
                pin_memory=pin,
            )
        if kind.startswith("stoker"):
            workers = kind[len("stoker") :]
            return stoker.DataLoader(
                dataset,
                batch_size=batch_size,
                sampler=sampler,
                num_workers=int(workers),
                device=device,
            )
        backend, _, workers = kind.partition(":")
        if backend in ("process", "thread"):
            return stoker.DataLoader(
                dataset,
                batch_size=batch_size,
                sampler=sampler,
                num_workers=int(workers),
                backend=cast(Any, backend),  # checked just above
                device=device,
            )
    except ValueError:
        pass
    raise SystemExit(
        f"unknown contender {kind!r}: auto, auto:thread, auto:process, torchN[:P], stokerN, "
        "process:N, thread:N, spdlN or torchdataN[:P]"
    )
