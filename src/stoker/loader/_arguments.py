"""Type checks of :class:`stoker.DataLoader`'s arguments, run before torch's own checks.

torch's DataLoader checks values of the right type (``num_workers=-1``, ``timeout=-1``,
``batch_size=0``, ``drop_last="no"``): those errors are left to it, word for word. What it lets
through to fail at ``iter()`` or never (``num_workers=2.5``, ``in_order="no"``,
``collate_fn=3``), or rejects with a bare comparison error (``num_workers="x"``: ``'<' not
supported between instances of 'str' and 'int'``), is caught here with a message naming the
argument, the value and the fix. A wrong type raises :class:`ConfigTypeError`, which is a
``TypeError`` (what torch raises for ``num_workers="x"``) and a ``ValueError`` (what it raises
for most of its own checks), so an ``except`` written for torch's loader still catches it.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from stoker.errors import ConfigError, ConfigTypeError
from stoker.loader._settings import MAX_NICE

__all__ = ["BACKENDS", "SHM_MODES", "check_arguments", "torch_rejects_combination"]

BACKENDS = ("process", "thread", "auto")
SHM_MODES = ("auto", "require")


def _found(value: Any) -> str:
    return f"Found: {value!r} ({type(value).__name__})."


def _is_int(value: Any) -> bool:
    """An integer, numpy's included, and not a bool (``True`` is not a count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_bool(name: str, value: Any, *, none: bool = False) -> None:
    # 0 and 1 (numpy's too) and numpy's bools pass: torch takes them, and code passes them.
    flag = isinstance(value, numbers.Integral) and value in (0, 1)
    if isinstance(value, (bool, np.bool_)) or flag or (none and value is None):
        return
    why = " (any non-empty string is true)" if isinstance(value, str) else ""
    allowed = "True, False or None" if none else "True or False"
    raise ConfigTypeError(f"`{name}` must be {allowed}{why}. {_found(value)}")


def _check_callable(name: str, value: Any, what: str) -> None:
    if value is not None and not callable(value):
        raise ConfigTypeError(f"`{name}` must be a function {what}, or None. {_found(value)}")


def _check_iterable(name: str, value: Any, what: str) -> None:
    if value is not None and not isinstance(value, Iterable):
        raise ConfigTypeError(f"`{name}` must be {what}, or None. {_found(value)}")


def torch_rejects_combination(
    dataset: Any, shuffle: Any, sampler: Any, batch_sampler: Any, batch_size: Any, drop_last: Any
) -> bool:
    """Whether torch's constructor rejects this combination of sampling arguments with its own
    ``ValueError`` (``shuffle=3`` with a ``sampler``, any ``sampler`` with an iterable dataset):
    stoker then leaves those arguments' types unchecked, so torch's message is the one seen."""
    if isinstance(dataset, tud.IterableDataset):
        datapipe = isinstance(dataset, tud.IterDataPipe)  # torch applies its shuffle setting
        return (not datapipe and not _is_false_or_none(shuffle)) or (
            sampler is not None or batch_sampler is not None
        )
    shuffled = _truthy(shuffle)
    if sampler is not None and shuffled:
        return True
    if batch_sampler is not None:
        return batch_size != 1 or shuffled or sampler is not None or _truthy(drop_last)
    return batch_size is None and _truthy(drop_last)


def _is_false_or_none(value: Any) -> bool:
    try:
        return value in {False, None}  # torch's test: 0 and 0.0 count as False
    except TypeError:  # unhashable
        return False


def _truthy(value: Any) -> bool:
    try:
        return bool(value)
    except Exception:  # torch's own bool() call raises it: ours need not decide
        return False


def check_arguments(
    *,
    dataset: Any,
    batch_size: Any,
    shuffle: Any,
    sampler: Any,
    batch_sampler: Any,
    num_workers: Any,
    collate_fn: Any,
    pin_memory: Any,
    drop_last: Any,
    timeout: Any,
    worker_init_fn: Any,
    generator: Any,
    prefetch_factor: Any,
    persistent_workers: Any,
    pin_memory_device: Any,
    in_order: Any,
    backend: Any,
    max_worker_restarts: Any,
    config: Any,
    distributed: Any,
    shm: Any = "auto",
    worker_nice: Any = 0,
) -> None:
    """Raise if an argument of :class:`stoker.DataLoader` has a type or value it cannot use.

    ``on_error``/``max_failures`` are checked by :class:`stoker.faults.FailurePolicy`,
    ``device`` by :func:`stoker.device.resolve_device`, and ``dataset``, ``batch_size``,
    ``drop_last`` and ``multiprocessing_context`` by torch's constructor. Where torch rejects
    the combination of ``shuffle``, ``sampler``, ``batch_sampler``, ``batch_size`` and
    ``drop_last``, their types are left unchecked, so torch's error and message come first.

    Raises:
        ConfigTypeError: an argument of the wrong type (a ``TypeError`` and a ``ValueError``).
        ConfigError: a value of the right type that stoker cannot use (``prefetch_factor=0``,
            ``timeout=nan``, ``backend="gpu"``, ``max_worker_restarts=-1``).
    """
    _check_counts(num_workers, prefetch_factor, timeout, max_worker_restarts)
    if not torch_rejects_combination(
        dataset, shuffle, sampler, batch_sampler, batch_size, drop_last
    ):
        _check_bool("shuffle", shuffle, none=True)
        _check_iterable("sampler", sampler, "an iterable of indices (a torch Sampler, a list)")
        _check_iterable(
            "batch_sampler", batch_sampler, "an iterable of lists of indices (a torch BatchSampler)"
        )
    _check_bool("pin_memory", pin_memory)
    _check_bool("persistent_workers", persistent_workers, none=True)
    _check_bool("in_order", in_order)
    _check_bool("distributed", distributed)
    _check_callable("collate_fn", collate_fn, "that merges a list of samples into a batch")
    _check_callable("worker_init_fn", worker_init_fn, "called with each worker's id")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ConfigTypeError(
            "`generator` must be a torch.Generator, e.g. `torch.Generator().manual_seed(0)`, or "
            f"None. {_found(generator)}"
        )
    _check_extras(pin_memory_device, shm, backend, config)
    _check_nice(worker_nice)


def _check_counts(
    num_workers: Any, prefetch_factor: Any, timeout: Any, max_worker_restarts: Any
) -> None:
    if not (_is_int(num_workers) or num_workers == "auto"):
        hint = " (a bool: pass 1 or 0)" if isinstance(num_workers, bool) else ""
        raise ConfigTypeError(
            '`num_workers` must be an int >= 0 (0 loads in the main process) or "auto"'
            f"{hint}. {_found(num_workers)}"
        )
    if not (_is_int(prefetch_factor) or prefetch_factor in ("auto", None)):
        raise ConfigTypeError(
            '`prefetch_factor` must be an int >= 1 (batches in flight per worker), "auto" or '
            f"None. {_found(prefetch_factor)}"
        )
    if _is_int(prefetch_factor) and prefetch_factor == 0:  # (a negative one: torch's error)
        raise ConfigError(
            '`prefetch_factor` must be an int >= 1 (batches in flight per worker), "auto" or '
            "None: 0 would never load ahead and torch fails at iter(). Found: 0."
        )
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ConfigTypeError(
            f"`timeout` must be a number of seconds >= 0 (0 waits forever). {_found(timeout)}"
        )
    if math.isnan(timeout):
        raise ConfigError(
            "`timeout` must be a number of seconds >= 0 (0 waits forever). Found: nan."
        )
    if not _is_int(max_worker_restarts):
        raise ConfigTypeError(
            f"`max_worker_restarts` must be an int >= 0. {_found(max_worker_restarts)}"
        )
    if max_worker_restarts < 0:
        raise ConfigError(
            f"`max_worker_restarts` must be an int >= 0. Found: {max_worker_restarts}."
        )


def _check_nice(worker_nice: Any) -> None:
    if not _is_int(worker_nice):
        raise ConfigTypeError(
            f"`worker_nice` must be an int from 0 to {MAX_NICE} (added to process workers' nice "
            f"value; 0 runs them at the training process's priority). {_found(worker_nice)}"
        )
    if not 0 <= worker_nice <= MAX_NICE:
        raise ConfigError(
            f"`worker_nice` must be an int from 0 to {MAX_NICE}: workers cannot run at a higher "
            "priority than the training process without privileges, and Linux stops at "
            f"{MAX_NICE}. Found: {worker_nice}."
        )


def _check_extras(pin_memory_device: Any, shm: Any, backend: Any, config: Any) -> None:
    if not isinstance(pin_memory_device, str):
        raise ConfigTypeError(
            f"`pin_memory_device` must be a str (deprecated in torch: leave it out). "
            f"{_found(pin_memory_device)}"
        )
    if not isinstance(shm, str) or shm not in SHM_MODES:
        raise ConfigError(
            f"`shm` must be one of {', '.join(map(repr, SHM_MODES))} (what a batch that finds "
            f"no room in shared memory does). {_found(shm)}"
        )
    if backend is not None and not isinstance(backend, str):
        raise ConfigTypeError(
            f"`backend` must be one of {', '.join(map(repr, BACKENDS))} or None. {_found(backend)}"
        )
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(
            f"`backend` must be one of {', '.join(map(repr, BACKENDS))}. Found: {backend!r}."
        )
    if config is not None and not isinstance(config, (str, os.PathLike)):
        raise ConfigTypeError(
            "`config` must be the path of a stoker.toml (a str or os.PathLike), or None. "
            f"{_found(config)}"
        )
