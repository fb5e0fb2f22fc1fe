"""Where worker processes cannot be started: ``processes_allowed`` and the thread fallback.

A ``multiprocessing.Pool`` worker is daemonic, and multiprocessing forbids daemonic processes
to have children ("daemonic processes are not allowed to have children"); a loader there runs
its workers as threads instead, with one warning naming why.
"""

from __future__ import annotations

import multiprocessing
import warnings
from typing import Any

import pytest
import torch

import stoker
from stoker.workers import _spawn
from stoker.workers._spawn import fallback_backend, processes_allowed

# Pools are forked: the functions below run in a copy of this process (nothing re-imported).
_FORK = multiprocessing.get_context("fork")


def _in_pool(fn: Any) -> Any:
    with _FORK.Pool(1) as pool:
        result = pool.apply(fn)
    pool.join()
    return result


def _in_process(fn: Any) -> Any:
    reader, writer = _FORK.Pipe(duplex=False)
    proc = _FORK.Process(target=lambda: writer.send(fn()))
    proc.start()
    writer.close()
    try:
        return reader.recv()
    finally:
        reader.close()
        proc.join()
        proc.close()


def _reasons() -> tuple[str | None, str | None]:
    return processes_allowed(), processes_allowed("spawn")


def _fallbacks() -> tuple[list[str], list[str]]:
    _spawn._fallback_warned = False  # this pool worker's first fallback
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = [fallback_backend("process", "fork") for _ in range(3)]
        chosen.append(fallback_backend("thread", "fork"))
    return chosen, [str(w.message) for w in caught if w.category is RuntimeWarning]


class Doubles(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([2 * i])


def _load_with_workers() -> tuple[list[int], list[str], str]:
    _spawn._fallback_warned = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = stoker.DataLoader(Doubles(), batch_size=3, num_workers=2)
        values = [v for batch in loader for v in batch.flatten().tolist()]
        backend = loader.stats().backend
        del loader
    return values, [str(w.message) for w in caught if w.category is RuntimeWarning], backend


def test_processes_are_allowed_in_the_main_process() -> None:
    assert processes_allowed() is None
    assert processes_allowed("spawn") is None and processes_allowed("forkserver") is None


def test_a_pool_worker_is_daemonic_and_says_so() -> None:
    default, spawn = _in_pool(_reasons)
    assert default == spawn
    assert default is not None
    assert "daemonic processes are not allowed to have children" in default
    assert "ForkPoolWorker" in default and "`multiprocessing.Pool` worker" in default


def test_a_plain_child_process_may_start_workers() -> None:
    assert _in_process(_reasons) == (None, None)


def test_spawn_without_an_executable_is_not_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing.spawn

    monkeypatch.setattr(multiprocessing.spawn, "get_executable", lambda: "")
    monkeypatch.setattr(_spawn.sys, "executable", "")
    for method in ("spawn", "forkserver"):
        why = processes_allowed(method)
        assert why is not None and "`sys.executable` is ''" in why and method in why
    assert processes_allowed("fork") is None  # fork needs no executable


def test_fallback_to_threads_warns_once_naming_why(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fallback_backend("process", "fork") == "process"  # processes allowed here
    assert fallback_backend("thread") == "thread"
    chosen, messages = _in_pool(_fallbacks)
    assert chosen == ["thread", "thread", "thread", "thread"]
    assert len(messages) == 1, messages
    assert "cannot start DataLoader worker processes here" in messages[0]
    assert "daemonic processes are not allowed to have children" in messages[0]
    assert '`backend="thread"`' in messages[0]


def test_loader_in_a_pool_worker_loads_with_threads() -> None:
    values, messages, backend = _in_pool(_load_with_workers)
    assert values == [2 * i for i in range(10)]
    assert backend == "thread"
    assert len(messages) == 1 and "daemonic processes" in messages[0], messages
