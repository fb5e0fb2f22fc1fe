"""A loader's arguments resolved (config file, ``"auto"`` values), and the frozen settings its
multi-worker iterator is built from."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from stoker._introspect.platform import usable_cores
from stoker.errors import ConfigError
from stoker.faults import FailurePolicy
from stoker.loader._config import load_config

__all__ = ["MAX_NICE", "WORKER_NICE", "Resolved", "WorkerSettings", "resolve_workers"]

# Added to process workers' nice value: the training step's threads then take a core from them
# as soon as they wake, instead of sharing it (torch's intra-op threads meet at a barrier after
# every op, so one thread kept off its core stalls the others). The bench's CPU step on 2
# cores, workers at 0 / 10 / 19: heavytail 14.4 / 16.8 / 18.2 steps/s (the step's own time
# 65 / 15 / 12 ms), jpeg 5.8 / 7.2 / 7.2; its GPU-like step within the spread
# (benchmarks/README.md). Niceness counts within an autogroup or cgroup, where other jobs'
# processes usually are not.
WORKER_NICE = 19
MAX_NICE = 19  # the most Linux accepts; more is clipped to it

# The defaults of the arguments a ``config=`` file may set: it applies only to an argument
# left at its default and not passed.
_CONFIG_DEFAULTS: dict[str, Any] = {
    "backend": None,
    "num_workers": 0,
    "prefetch_factor": None,
    "pin_memory": False,
    "persistent_workers": None,
    "in_order": True,
}


@dataclass(frozen=True)
class Resolved:
    """A ``DataLoader``'s worker arguments once the ``config=`` file and ``"auto"`` values are
    applied (``backend="auto"`` is resolved later, by the probe, at the first ``iter()``)."""

    backend: Literal["process", "thread", "auto"]
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    in_order: bool
    auto_workers: bool
    auto_prefetch: bool


def resolve_workers(
    *,
    backend: Literal["process", "thread", "auto"] | None,
    num_workers: int | str,
    prefetch_factor: int | str | None,
    pin_memory: bool,
    persistent_workers: bool | None,
    in_order: bool,
    config: str | os.PathLike[str] | None,
    passed: frozenset[str],
) -> Resolved:
    """Resolve the worker arguments (already checked by ``check_arguments``).

    Args:
        config: a ``stoker.toml`` whose ``[loader]`` settings apply to the arguments left at
            their defaults and not in ``passed``.
        passed: the arguments the caller passed (``num_workers=0`` passed to debug in the
            main process wins over the file's workers, though 0 is also the default).

    Raises:
        ConfigError: for ``prefetch_factor="auto"`` without workers, or a bad config file.
    """
    given: dict[str, Any] = {
        "backend": backend,
        "num_workers": num_workers,
        "prefetch_factor": prefetch_factor,
        "pin_memory": pin_memory,
        "persistent_workers": persistent_workers,
        "in_order": in_order,
    }
    if config is not None:
        _apply_config(given, config, passed)
    workers, prefetch = given["num_workers"], given["prefetch_factor"]
    auto_workers, auto_prefetch = workers == "auto", prefetch == "auto"
    if auto_workers:
        workers = usable_cores()
    if auto_prefetch:
        if workers == 0:
            raise ConfigError(
                '`prefetch_factor="auto"` needs workers: pass `num_workers` > 0 or "auto".'
            )
        prefetch = 2
    persistent = given["persistent_workers"]
    return Resolved(
        backend=given["backend"] or ("auto" if auto_workers else "process"),
        num_workers=workers,
        prefetch_factor=prefetch,
        pin_memory=given["pin_memory"],
        persistent_workers=workers > 0 if persistent is None else persistent,
        in_order=given["in_order"],
        auto_workers=auto_workers,
        auto_prefetch=auto_prefetch,
    )


def _apply_config(
    given: dict[str, Any], config: str | os.PathLike[str], passed: frozenset[str]
) -> None:
    for key, value in load_config(config).items():
        if key not in passed and given[key] == _CONFIG_DEFAULTS[key]:  # the file decides
            given[key] = value
    if given["num_workers"] == 0:  # passed: the file's worker settings do not apply
        for key in ("prefetch_factor", "persistent_workers"):
            if key not in passed:
                given[key] = _CONFIG_DEFAULTS[key]


@dataclass(frozen=True)
class WorkerSettings:
    """What a ``DataLoader`` resolved its arguments to, for an iterator with workers.

    Taken when an iterator starts (``DataLoader._worker_settings``): the iterator reads these,
    never the loader's private attributes.

    Args:
        backend: ``"process"`` or ``"thread"`` (``"auto"`` resolved by the probe).
        in_order: deliver batches in sampler order.
        prefetch: batches in flight per worker.
        policy: ``on_error`` and ``max_failures``.
        max_worker_restarts: dead workers that may be replaced.
        device: deliver batches on this device; None: host batches.
        mp_context: the multiprocessing context (None: the platform's default).
        shm_require: no room in shared memory is an error (``shm="require"``).
        worker_init_fn: the user's per-worker setup.
        auto_workers: ``num_workers="auto"``: a controller sizes the pool.
        auto_prefetch: ``prefetch_factor="auto"``: the controller sizes the depth too.
        probed_wait_share: the share of loading time the backend probe saw waiting (None:
            not probed).
        threads_wanted: the probe chose threads to cover waits: processes first, handed over
            to threads once the loop leaves the GIL free (stoker.loader._switch).
        notes: what resolving ``backend`` found (for ``stats().notes``).
        nice: added to process workers' nice value (``worker_nice``).
    """

    backend: str
    in_order: bool
    prefetch: int
    policy: FailurePolicy
    max_worker_restarts: int
    device: torch.device | None
    mp_context: Any
    shm_require: bool
    worker_init_fn: Callable[[int], None] | None
    auto_workers: bool
    auto_prefetch: bool
    probed_wait_share: float | None
    threads_wanted: bool
    notes: tuple[str, ...]
    nice: int = 0
