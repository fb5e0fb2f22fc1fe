"""The bench keeps a peer's known teardown tracebacks off its report, and nothing else."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any

import pytest

from stoker.bench._peer_noise import quiet_peer_teardown

# Code that seems to come from a peer's module and file, as torchdata's own does.
_PEER_CODE = compile(
    "def fail():\n    raise FileNotFoundError(2, 'No such file or directory')\n"
    "class _ParallelMapperIter:\n"
    "    def __del__(self):\n        raise AssertionError('can only test a child process')\n",
    "/site-packages/torchdata/nodes/map.py",
    "exec",
)


def _peer(name: str) -> Any:
    scope: dict[str, Any] = {"__name__": "torchdata.nodes.map"}
    exec(_PEER_CODE, scope)
    return scope[name]


def _peer_fail() -> Any:
    return _peer("fail")


class _Owner:
    def __del__(self) -> None:
        raise AssertionError("can only test a child process")


def _run_thread(target: Any) -> None:
    t = threading.Thread(target=target)
    t.start()
    t.join()


def test_peer_errors_are_counted_and_others_still_reach_the_hooks(monkeypatch) -> None:
    seen_unraisable: list[str] = []
    seen_threads: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen_unraisable.append(str(u.exc_value)))
    monkeypatch.setattr(threading, "excepthook", lambda a: seen_threads.append(str(a.exc_value)))
    peer_owner = _peer("_ParallelMapperIter")

    def ours() -> None:
        raise ValueError("stoker's own")

    with quiet_peer_teardown() as noise:
        peer_owner()  # collected at once: its __del__ raises
        _Owner()
        gc.collect()
        _run_thread(_peer_fail())
        _run_thread(ours)
    assert (noise.unraisable, noise.threads, noise.total) == (1, 1, 2)
    assert seen_unraisable == ["can only test a child process"]  # the one not from the peer
    assert seen_threads == ["stoker's own"]
    # Outside the context the hooks are the ones it found.
    assert sys.unraisablehook is not None and threading.excepthook is not None
    _run_thread(_peer_fail())
    assert seen_threads == ["stoker's own", "[Errno 2] No such file or directory"]


@pytest.mark.parametrize("module", ["torchdata_extra", "mytorchdata.nodes"])
def test_a_module_that_only_looks_like_the_peer_is_not_hidden(module, monkeypatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(module))
    code = compile(
        "class X:\n    def __del__(self):\n        raise AssertionError('x')\n",
        f"/site-packages/{module.split('.')[0]}/x.py",
        "exec",
    )
    scope: dict[str, Any] = {"__name__": module}
    exec(code, scope)
    lookalike = scope["X"]
    with quiet_peer_teardown() as noise:
        lookalike()
        gc.collect()
    assert noise.total == 0 and seen == [module]
