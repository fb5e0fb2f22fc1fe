"""What reaches the main process when a worker's dataset raises something unusual.

Promises: an exception keeps its type, its attributes and its message even when pickle cannot
rebuild it (an ``__init__`` with other arguments than ``args``, an unpicklable attribute, a
class defined in the script's ``__main__``), and when its ``__str__`` is broken;
``sys.exit()`` or a ``KeyboardInterrupt`` raised in a worker's ``__getitem__`` becomes a
:class:`stoker.WorkerError` that says so (re-raised as is, it ended the training script with no
message); a ``StopIteration`` escaping a map-style ``__getitem__`` ends the epoch there, as
with torch's loaders, on every backend (process workers used to drop that batch and go on).
Each case runs in a forked child with a hard time limit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import traceback
from typing import Any

import pytest
import torch
import torch.utils.data as tud
from _isolate import run_case

import stoker

pytestmark = pytest.mark.timeout(120)

N = 12
BAD = 5
MODES = [
    pytest.param({"num_workers": 2}, id="process"),
    pytest.param({"num_workers": 2, "backend": "thread"}, id="thread"),
]


class PathError(Exception):
    """Built from (path, code), not from its message: pickle cannot rebuild it from args."""

    def __init__(self, path: str, code: int) -> None:
        super().__init__(f"{path} failed with code {code}")
        self.path, self.code = path, code
        self.lock = threading.Lock()  # and it cannot be pickled as it is


class KeywordError(Exception):
    def __init__(self, *, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadStrError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ broke")


def _raise(kind: str, index: int) -> Any:
    if kind == "path":
        raise PathError(f"/data/{index}.jpg", 7)
    if kind == "keyword":
        raise KeywordError(reason=f"sample {index} is truncated")
    if kind == "badstr":
        raise BadStrError()
    if kind == "exit":
        sys.exit(5)
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "stop":
        next(iter([]))  # a reader that ran out: StopIteration escapes __getitem__
    raise ValueError(kind)


class Raising(tud.Dataset[int]):
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        if i == BAD:
            _raise(self.kind, i)
        return i


def case_first_error(kind: str, loader_cls: str = "stoker", **kwargs: Any) -> dict[str, Any]:
    cls = stoker.DataLoader if loader_cls == "stoker" else tud.DataLoader
    if kwargs.get("num_workers"):
        kwargs["multiprocessing_context"] = "fork"
    loader = cls(Raising(kind), batch_size=2, **kwargs)
    batches: list[list[int]] = []
    out: dict[str, Any] = {"error": None}
    try:
        for batch in loader:
            batches.append(batch.tolist())
    except BaseException as exc:
        cause = exc.__cause__
        out["error"] = {
            "type": type(exc).__name__,
            "is_class": type(exc) in (PathError, KeywordError, BadStrError),
            "attrs": {k: repr(v)[:40] for k, v in vars(exc).items() if k != "__notes__"},
            "message": _safe_str(exc),
            "notes": list(getattr(exc, "__notes__", [])),
            "cause": "".join(traceback.format_exception(cause)) if cause is not None else "",
        }
    out["batches"] = batches
    del loader
    return out


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as err:
        return f"<str failed: {err}>"


@pytest.mark.parametrize("mode", MODES)
def test_an_exception_pickle_cannot_rebuild_keeps_its_type_and_attributes(
    mode: dict[str, Any],
) -> None:
    err = run_case(case_first_error, kind="path", **mode).result["error"]
    assert err["type"] == "PathError" and err["is_class"], err
    assert err["message"] == f"/data/{BAD}.jpg failed with code 7"
    assert err["attrs"]["path"] == repr(f"/data/{BAD}.jpg") and err["attrs"]["code"] == "7"
    assert "lock" in err["attrs"]  # the lock itself (thread) or its repr (process)
    assert any(f"[{BAD - 1}, {BAD}]" in note for note in err["notes"]), err["notes"]

    err = run_case(case_first_error, kind="keyword", **mode).result["error"]
    assert err["type"] == "KeywordError" and err["is_class"], err
    assert err["attrs"]["reason"] == repr(f"sample {BAD} is truncated")


@pytest.mark.parametrize("mode", MODES)
def test_an_exception_whose_str_breaks_keeps_its_type(mode: dict[str, Any]) -> None:
    err = run_case(case_first_error, kind="badstr", **mode).result["error"]
    assert err["type"] == "BadStrError" and err["is_class"], err


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
@pytest.mark.parametrize("mode", MODES)
def test_sys_exit_in_a_worker_is_an_error_that_says_so(kind: str, mode: dict[str, Any]) -> None:
    r = run_case(case_first_error, kind=kind, **mode).result
    err = r["error"]
    assert err is not None and err["type"] == "WorkerError", err
    if kind == "exit":
        assert err["message"].startswith("sys.exit() was called in a worker (SystemExit(5))")
    else:
        assert err["message"].startswith("KeyboardInterrupt was raised in a worker")
    assert 'on_error="skip"' in err["message"]
    assert any(f"[{BAD - 1}, {BAD}]" in note for note in err["notes"]), err["notes"]
    assert "_raise" in err["cause"], err["cause"]  # the traceback shows where
    assert r["batches"] == [[0, 1], [2, 3]]


def test_sys_exit_in_a_worker_does_not_end_the_script_silently(tmp_path: Any) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import stoker
            import torch.utils.data as tud

            class DS(tud.Dataset):
                def __len__(self):
                    return 8
                def __getitem__(self, i):
                    if i == 5:
                        sys.exit(5)
                    return i

            if __name__ == "__main__":
                try:
                    for _ in stoker.DataLoader(DS(), batch_size=2, num_workers=2):
                        pass
                except stoker.WorkerError as exc:
                    print("caught:", str(exc).splitlines()[0])
                    sys.exit(0)
                print("finished without an error")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("caught: sys.exit() was called in a worker"), done.stdout


@pytest.fixture(scope="module")
def torch_stop_iteration() -> dict[bool, Any]:
    """What torch's loader does, in the main process and with a worker (once per module:
    torch's workers, left mid-epoch, take 5 s each to stop)."""
    return {
        workers: run_case(
            case_first_error, kind="stop", loader_cls="torch", num_workers=int(workers)
        ).result
        for workers in (False, True)
    }


@pytest.mark.parametrize(
    "mode", [pytest.param({}, id="main"), *MODES, pytest.param({"num_workers": 1}, id="one")]
)
def test_stop_iteration_from_getitem_ends_the_epoch_as_torch_does(
    mode: dict[str, Any], torch_stop_iteration: dict[bool, Any]
) -> None:
    got = run_case(case_first_error, kind="stop", **mode).result
    ref = torch_stop_iteration[bool(mode.get("num_workers"))]
    assert ref["batches"] == [[0, 1], [2, 3]] and ref["error"] is None
    assert got["batches"] == ref["batches"] and got["error"] is None, got


def test_a_class_defined_in_main_is_caught_by_the_script_under_fork(tmp_path: Any) -> None:
    """cloudpickle sends classes of ``__main__`` by value: the main process got a copy of the
    class, which the script's own ``except`` clause did not catch."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import stoker
            import torch.utils.data as tud

            class Corrupt(Exception):
                def __init__(self, path, code):
                    super().__init__(f"{path}: {code}")
                    self.path = path

            class DS(tud.Dataset):
                def __len__(self):
                    return 8
                def __getitem__(self, i):
                    if i == 5:
                        raise Corrupt(f"/data/{i}.jpg", 3)
                    return i

            if __name__ == "__main__":
                try:
                    for _ in stoker.DataLoader(DS(), batch_size=2, num_workers=2):
                        pass
                except Corrupt as exc:
                    print("caught", exc.path)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "caught /data/5.jpg", (done.stdout, done.stderr)


def test_torch_tensors_in_an_exception_survive() -> None:
    """An attribute that pickles (a tensor) comes back as itself, not as its repr."""
    err = PathError("/x", 1)
    err.lock = torch.zeros(2)  # type: ignore[assignment]
    from stoker.workers._errors import pack_exception, unpack_exception

    back = unpack_exception(pack_exception(err, "loading"), 0, 123, [1])
    assert type(back) is PathError and torch.equal(back.lock, torch.zeros(2))  # type: ignore[arg-type]
