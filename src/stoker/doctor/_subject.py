"""What a runtime diagnosis looks at: a loader (or a bare dataset) and its effective settings.

``module:factory`` targets are resolved here too: the factory is imported and called with no
arguments, and must return a DataLoader, a Dataset, or something iterable with ``__getitem__``.
"""

# stoker's loader is imported when a subject is first inspected (start-up of the doctor).

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.utils.data as tud

from stoker._introspect import platform as _platform
from stoker.errors import ConfigError

__all__ = ["Subject", "load_factory", "subject_of"]


def default_start_method() -> str:
    """The start method new processes get, without fixing the global context as a side effect."""
    chosen = multiprocessing.get_start_method(allow_none=True)
    return chosen or multiprocessing.get_all_start_methods()[0]


@dataclass(frozen=True)
class Subject:
    """A dataset and the loader settings that decide how it will be loaded.

    ``num_workers`` is ``None`` for a bare dataset (loader settings unknown: the checks that
    need them are skipped).
    """

    dataset: Any
    loader: tud.DataLoader[Any] | None
    num_workers: int | None
    batch_size: int | None
    prefetch_factor: int
    collate_fn: Callable[[list[Any]], Any] | None
    worker_init_fn: Callable[[int], None] | None
    start_method: str
    pin_memory: bool
    is_stoker: bool

    @property
    def has_workers(self) -> bool:
        return bool(self.num_workers)

    @property
    def iterable(self) -> bool:
        return isinstance(self.dataset, tud.IterableDataset) or not hasattr(
            self.dataset, "__getitem__"
        )

    @property
    def shm_path(self) -> str:
        """Where in-flight batches live: stoker's shm directory, or /dev/shm for torch."""
        return _platform.shm_dir() if self.is_stoker else _platform.DEFAULT_SHM_DIR

    def describe(self) -> str:
        kind = type(self.loader if self.loader is not None else self.dataset)
        return f"{kind.__module__}.{kind.__qualname__}"


def _start_method_of(loader: tud.DataLoader[Any]) -> str:
    ctx = loader.multiprocessing_context
    if ctx is None:
        return default_start_method()
    if isinstance(ctx, str):
        return ctx
    return str(ctx.get_start_method())


def subject_of(obj: Any) -> Subject:
    """Build a :class:`Subject` from a DataLoader, a Dataset or a zero-argument factory.

    Raises:
        ConfigError: if ``obj`` is none of these (the message names its type).
    """
    if callable(obj) and not isinstance(obj, (tud.DataLoader, tud.Dataset)):
        try:
            obj = obj()
        except TypeError as exc:
            raise ConfigError(
                f"`obj` was called as a zero-argument factory and raised: {exc}. Pass a "
                "DataLoader, a Dataset, or a function that takes no arguments and returns one."
            ) from exc
    if isinstance(obj, tud.DataLoader):
        from stoker.loader._loader import DataLoader as StokerLoader

        workers = int(obj.num_workers)
        prefetch = obj.prefetch_factor if workers > 0 and obj.prefetch_factor else 2
        collate = obj.collate_fn
        default_collates = (tud.default_collate, tud.default_convert)
        return Subject(
            dataset=obj.dataset,
            loader=obj,
            num_workers=workers,
            batch_size=obj.batch_size,
            prefetch_factor=int(prefetch),
            collate_fn=None if collate in default_collates else collate,
            worker_init_fn=obj.worker_init_fn,
            start_method=_start_method_of(obj) if workers > 0 else default_start_method(),
            pin_memory=bool(obj.pin_memory),
            is_stoker=isinstance(obj, StokerLoader),
        )
    if isinstance(obj, tud.Dataset) or hasattr(obj, "__getitem__") or hasattr(obj, "__iter__"):
        return Subject(
            dataset=obj,
            loader=None,
            num_workers=None,
            batch_size=None,
            prefetch_factor=2,
            collate_fn=None,
            worker_init_fn=None,
            start_method=default_start_method(),
            pin_memory=False,
            is_stoker=False,
        )
    raise ConfigError(
        "`diagnose` needs a DataLoader, a Dataset, or a zero-argument function returning one. "
        f"Found: {type(obj).__module__}.{type(obj).__qualname__}."
    )


def load_factory(spec: str) -> Callable[[], Any]:
    """Import ``module:attr`` (or ``path/to/file.py:attr``) and return the attribute.

    The current directory is put first on ``sys.path``, as ``python -m`` does.

    Raises:
        ConfigError: if the spec is malformed, the module cannot be imported or has no such
            attribute.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"a factory target must look like `package.module:make_loader`. Found: {spec!r}."
        )
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            name = f"_stoker_doctor_{path.stem}"
            file_spec = importlib.util.spec_from_file_location(name, path)
            if file_spec is None or file_spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[name] = module
            file_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as exc:
        raise ConfigError(
            f"cannot import {module_name!r} for target {spec!r}: {exc}. Run `stoker doctor` "
            "from the directory that makes it importable, or pass `path/to/file.py:factory`."
        ) from exc
    try:
        factory = getattr(module, attr)
    except AttributeError:
        names = sorted(n for n in vars(module) if not n.startswith("_"))
        raise ConfigError(
            f"module {module_name!r} has no attribute {attr!r}. Found: {', '.join(names[:20])}."
        ) from None
    return factory
