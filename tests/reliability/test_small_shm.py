"""A container's small /dev/shm (a real 4 MiB tmpfs): batches that fit only a few at a time, or
not at all, all arrive; never a failure that depends on timing; nothing is left behind.

Each case runs in a forked child with a hard limit (``run_case``); the tmpfs is mounted by the
fixture (root only) and unmounted in its teardown.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from _isolate import run_case

import stoker

pytestmark = pytest.mark.timeout(180)

TMPFS_BYTES = 4 << 20
SAMPLES = 48
# Batches the training loop keeps referenced at once (a loop that holds its last few batches
# for logging or gradient accumulation keeps their slots busy).
HELD = 3


class Blobs(tud.Dataset[torch.Tensor]):
    """Sample ``i``: ``nbytes`` of float32 all equal to ``i``."""

    def __init__(self, nbytes: int, n: int = SAMPLES) -> None:
        self.nbytes = nbytes
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(np.full(self.nbytes // 4, i, dtype=np.float32))


@pytest.fixture
def small_shm() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = Path(tempfile.mkdtemp(prefix="stoker-small-shm-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        path.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def case_epoch(
    directory: str,
    nbytes: int,
    *,
    shm: str = "auto",
    load: bool = False,
    fill: bool = False,
    spill: bool = True,
) -> dict[str, Any]:
    """One epoch over ``Blobs(nbytes)``, holding the last :data:`HELD` batches; with
    ``spill=False`` the temp directory is the small tmpfs too (nowhere to spill)."""
    os.environ["STOKER_SHM_DIR"] = directory
    if not spill:
        tempfile.tempdir = directory
    # A child forked from a test process whose OpenMP team ran hangs in its first parallel
    # region (libgomp is not fork-safe): one thread here.
    torch.set_num_threads(1)
    burner = None
    if load:  # another CPU-bound job beside the loader
        burner = mp.get_context("fork").Process(target=_burn, args=(120.0,), daemon=True)
        burner.start()
    filler = os.path.join(directory, "other-process-data")
    kwargs: dict[str, Any] = {} if shm == "auto" else {"shm": shm}
    loader = stoker.DataLoader(
        Blobs(nbytes), batch_size=1, num_workers=2, multiprocessing_context="fork", **kwargs
    )
    got: list[int] = []
    held: list[torch.Tensor] = []
    error: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for step, batch in enumerate(loader):
                values = batch.numpy()
                got.append(int(values[0, 0]))
                assert (values == values[0, 0]).all(), "a batch's bytes were mixed up"
                filled = fill and SAMPLES // 4 <= step < SAMPLES // 2
                # While the directory is full, the loop holds every batch: workers need slots.
                held = [*held, batch] if filled else [*held, batch][-HELD:]
                if fill and step == SAMPLES // 4:
                    # Another process takes what is left of the directory for a while.
                    with open(filler, "wb") as f:
                        with contextlib.suppress(OSError):
                            os.posix_fallocate(f.fileno(), 0, TMPFS_BYTES)
                if fill and step == SAMPLES // 2:
                    os.unlink(filler)
        except Exception as exc:
            error = {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    stats = loader.stats()
    del loader, held
    gc.collect()
    if burner is not None:
        burner.kill()
        burner.join()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(filler)
    return {
        "got": got,
        "error": error,
        "warnings": [str(w.message) for w in caught if "shared-memory slot" in str(w.message)],
        "fallback_batches": stats.fallback_batches,
        "spilled_batches": stats.spilled_batches,
        "left": os.listdir(directory),
        "spill_left": [
            n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"stoker-{os.getpid()}-")
        ],
    }


@pytest.mark.parametrize("load", [False, True], ids=["quiet", "under-cpu-load"])
@pytest.mark.parametrize("mib", [0.5, 1.0])
def test_batches_that_fit_a_few_at_a_time_all_arrive(
    small_shm: Path, mib: float, load: bool
) -> None:
    for _ in range(3):  # a failure that depends on timing must not pass by chance
        r = run_case(case_epoch, directory=str(small_shm), nbytes=int(mib * (1 << 20)), load=load)
        r = r.result
        assert r["error"] == {}, r["error"]
        assert r["got"] == list(range(SAMPLES))
        assert len(r["warnings"]) <= 1, r["warnings"]
        assert r["left"] == []


def test_a_batch_larger_than_the_directory_goes_to_the_temp_dir_with_one_warning(
    small_shm: Path,
) -> None:
    r = run_case(case_epoch, directory=str(small_shm), nbytes=6 << 20).result
    assert r["error"] == {}, r["error"]
    assert r["got"] == list(range(SAMPLES))
    assert r["spilled_batches"] == SAMPLES and r["fallback_batches"] == 0, r
    assert len(r["warnings"]) == 1, r["warnings"]
    message = r["warnings"][0]
    assert str(small_shm) in message and "--shm-size" in message and "STOKER_SHM_DIR" in message
    assert 'shm="require"' in message and tempfile.gettempdir() in message
    assert "a batch of 6.0 MiB" in message, message  # the batch's size, not its header's
    assert r["left"] == [] and r["spill_left"] == []


def test_with_nowhere_to_spill_a_batch_crosses_the_pipe_with_one_warning(
    small_shm: Path,
) -> None:
    r = run_case(case_epoch, directory=str(small_shm), nbytes=6 << 20, spill=False).result
    assert r["error"] == {}, r["error"]
    assert r["got"] == list(range(SAMPLES))
    assert r["fallback_batches"] == SAMPLES and r["spilled_batches"] == 0, r
    assert len(r["warnings"]) == 1, r["warnings"]
    assert "through the pipe" in r["warnings"][0]
    assert r["left"] == []


def test_shm_require_keeps_the_clear_error(small_shm: Path) -> None:
    r = run_case(case_epoch, directory=str(small_shm), nbytes=6 << 20, shm="require").result
    err = r["error"]
    assert "SharedMemoryError" in err.get("mro", []), r
    assert str(small_shm) in err["message"] and "--shm-size" in err["message"]
    assert r["got"] == []
    assert r["left"] == []


def test_another_process_filling_the_directory_mid_epoch_loses_nothing(small_shm: Path) -> None:
    r = run_case(case_epoch, directory=str(small_shm), nbytes=256 << 10, fill=True).result
    assert r["error"] == {}, r["error"]
    assert r["got"] == list(range(SAMPLES))
    felt = r["fallback_batches"] + r["spilled_batches"]
    assert felt > 0, "the filled directory was never felt: the test is void"
    assert r["left"] == []


def case_watched(directory: str) -> dict[str, Any]:
    os.environ["STOKER_SHM_DIR"] = directory
    torch.set_num_threads(1)
    loader = stoker.DataLoader(
        Blobs(6 << 20, n=16), batch_size=1, num_workers=2, multiprocessing_context="fork"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = stoker.watch(loader, every=4, progress=False)
        for _ in w:
            pass
    reports = [(r.loader.off_shm_batches if r.loader else None, r.diagnosis) for r in w.reports]
    del w, loader
    gc.collect()
    return {"reports": reports}


def test_the_monitor_shows_batches_that_found_no_room(small_shm: Path) -> None:
    r = run_case(case_watched, directory=str(small_shm)).result
    counts = [c for c, _ in r["reports"]]
    assert counts and counts[-1] and counts[-1] > 0, r["reports"]
    assert any("no room in shared memory" in text for _, text in r["reports"]), r["reports"]


def test_the_no_room_warning_names_the_users_line(tmp_path: Path) -> None:
    """It named `_iterator.py` inside stoker; it names the first frame outside stoker and
    torch's loader."""
    from stoker.transport import warn_no_room

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_no_room(str(tmp_path), 6 << 20, str(tmp_path / "spill"))
    (w,) = caught
    assert w.filename == __file__ and "a batch of 6.0 MiB" in str(w.message)
