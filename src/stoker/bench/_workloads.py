"""What a bench workload is, the registry of workloads, and the data cache.

A workload is a recipe: how to build its dataset (data generated on first use into the cache
directory, never downloaded), the batch size, and how the harness should drive it. Built-in
workloads register themselves when their module is imported; a new family of workloads lives
in its own module and needs one line there::

    register(Workload(name="shards", description="...", make_dataset=make_shards, batch_size=64))

plus its module name in ``_BUILTIN_MODULES`` below so that ``stoker bench`` finds it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stoker.errors import ConfigError

__all__ = [
    "CACHE_ENV",
    "Workload",
    "builtin_workloads",
    "cache_dir",
    "get_workload",
    "register",
]

CACHE_ENV = "STOKER_CACHE"
# Modules that register built-in workloads when imported (add yours here).
_BUILTIN_MODULES: tuple[str, ...] = (
    "stoker.bench._synthetic",
    "stoker.bench._jpeg",
    "stoker.bench._shards",
    "stoker.bench._remote",
)

Mode = Literal["steady", "epochs"]
_MODES: tuple[str, ...] = ("steady", "epochs")


@dataclass(frozen=True)
class Workload:
    """A benchmark workload.

    Attributes:
        name: short identifier used on the command line (``--workload NAME``).
        description: one line saying what it stresses.
        make_dataset: called with ``quick`` (a bool) in the main process; returns the dataset
            (a module-level, picklable class, so that spawn start methods work). It may
            generate files into :func:`cache_dir` on first use.
        batch_size: samples per batch.
        mode: ``"steady"`` (default) times warm loaders over repeated runs; ``"epochs"``
            builds a fresh loader per repeat and times ``epochs`` full epochs, recording each
            epoch's first-batch latency (persistent vs non-persistent workers).
        epochs: epochs per repeat in ``"epochs"`` mode. Default 3.
        samples_per_run: samples every timed run draws (at random, with a fixed seed per
            repeat), however long that takes. ``None`` (default): runs are timed instead, each
            lasting about the harness's run time (at least a few batches per worker).
        in_quick: whether ``--quick`` runs it by default.
        quick_batch_size: samples per batch in quick mode (``None``: ``batch_size``). A
            workload of slow samples takes a smaller batch there: every timed run lasts at
            least two batches per worker, and jpeg's 64 kept one run of 4 workers over 4 s.
        ideal_note: how the ideal (this machine's limit) is to be read for this workload.
        ideal_is_limit: whether every loader must do the work the ideal measures (fetch and
            torch's ``default_collate``), so that it bounds them all. ``False`` where a loader
            can skip part of it: the table and verdict then give no "% ideal". Default
            ``True``.
        runner: for a workload that measures its own contenders (each reading its own copy
            of the data, as the ``remote`` workload's libraries do):
            ``runner(workload, plan, quick, report)`` returns its ``WorkloadResult`` in place
            of the harness's procedure. Default ``None``.
    """

    name: str
    description: str
    make_dataset: Callable[[bool], Any]
    batch_size: int
    mode: Mode = "steady"
    epochs: int = 3
    samples_per_run: int | None = None
    in_quick: bool = False
    quick_batch_size: int | None = None
    ideal_note: str = (
        "usable cores / single-process CPU seconds per sample (fetch + collate, measured first)"
    )
    ideal_is_limit: bool = True
    runner: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c.isspace() for c in self.name):
            raise ConfigError(
                f"`name` must be a non-empty string without spaces. Found: {self.name!r}."
            )
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"`batch_size` must be an int >= 1. Found: {self.batch_size!r}.")
        if self.quick_batch_size is not None and (
            not isinstance(self.quick_batch_size, int) or self.quick_batch_size < 1
        ):
            raise ConfigError(
                f"`quick_batch_size` must be an int >= 1 or None. Found: {self.quick_batch_size!r}."
            )
        if self.mode not in _MODES:
            raise ConfigError(f"`mode` must be one of {_MODES}. Found: {self.mode!r}.")
        if self.epochs < 1:
            raise ConfigError(f"`epochs` must be >= 1. Found: {self.epochs!r}.")
        if self.samples_per_run is not None and self.samples_per_run < 1:
            raise ConfigError(
                f"`samples_per_run` must be >= 1 or None. Found: {self.samples_per_run!r}."
            )


_REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    """Add a workload to the registry (a later registration under the same name replaces it).

    Args:
        workload: the workload.

    Returns:
        The workload, so that the call can be used as an expression.
    """
    _REGISTRY[workload.name] = workload
    return workload


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def builtin_workloads() -> dict[str, Workload]:
    """Every registered workload by name, in registration order."""
    _load_builtins()
    return dict(_REGISTRY)


def get_workload(name: str) -> Workload:
    """The registered workload called ``name``.

    Raises:
        ConfigError: if there is none; the message lists the known names.
    """
    known = builtin_workloads()
    if name not in known:
        raise ConfigError(
            f"unknown workload {name!r}: pick one of {', '.join(known)} "
            "(or bench your own dataset with `--dataset module:factory`)."
        )
    return known[name]


def cache_dir() -> Path:
    """Where generated bench data lives: ``$STOKER_CACHE`` or ``~/.cache/stoker``.

    The directory is created if needed.
    """
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "stoker")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
