"""Another user of a shared /dev/shm plants files where stoker writes: nothing of theirs is
followed, read, or removed, and the loader still delivers every sample.

The attacker is user nobody (a forked child that drops root), the shared directory a
world-writable sticky one like /dev/shm, pointed at with ``STOKER_SHM_DIR``. Every name the
attacker can guess is planted: those an older stoker used (``stoker-<pid>-<pool>-status``,
``-stack-<worker>``, ``-task-<n>``, built from the main process's public pid) as symlinks to a
victim file and as FIFOs that would feed a pickle to a worker, plus another user's stale
files and directories named like stoker's. Batches of 1,500 indices take the task queue's
overflow path (a task over 4 KiB).
"""

from __future__ import annotations

import os
import pickle
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data as tud
from _faulty import RandomDataset, indices_of
from _isolate import run_case

import stoker
from _users import REFUSED, as_nobody, shared_tmp_dir
from stoker.transport import MARKER

pytestmark = pytest.mark.timeout(120)

SAMPLES = 3000
BATCH = 1500  # a pickled batch of this many indices is over one 4 KiB task record
# Guesses of the pool ids an attacker plants names for.
POOL_GUESSES = range(4)
VICTIM_BYTES = b"root's secret, mode 0600\n"
EVIL_PICKLE = pickle.dumps(("evil",))


def _plant(directory: str, pid: int) -> None:
    """What user nobody plants before the victim's loader starts."""
    for pool in POOL_GUESSES:
        base = os.path.join(directory, f"stoker-{pid}-{pool}-")
        for name in ("status", "stack-0", "stack-1"):
            os.symlink(os.environ["VICTIM"], base + name)
        for n in (1, 2):
            os.mkfifo(base + f"task-{n}")
    stale_file = os.path.join(directory, f"stoker-{pid + 1}-0-status")
    with open(stale_file, "wb") as f:
        f.write(b"theirs")
    os.mkdir(os.path.join(directory, f"stoker-{pid}-theirs"))
    with open(os.path.join(directory, f"stoker-{pid}-theirs", "f"), "wb") as f:
        f.write(b"theirs")


def _snapshot(directory: str) -> dict[str, tuple[int, int, int]]:
    """(mode, uid, size) of every entry, one level into directories."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            out[os.path.relpath(path, directory)] = (st.st_mode, st.st_uid, st.st_size)
    return out


def case_planted(directory: str, victim: str) -> dict[str, Any]:
    os.environ["STOKER_SHM_DIR"] = directory
    os.environ["VICTIM"] = victim
    planted_rc = as_nobody(_plant, directory, os.getpid())
    before = _snapshot(directory)
    sampler = tud.BatchSampler(range(SAMPLES), BATCH, drop_last=False)
    loader = stoker.DataLoader(
        RandomDataset(SAMPLES),
        batch_sampler=sampler,
        num_workers=2,
        multiprocessing_context="fork",
    )
    pools: list[dict[str, Any]] = []
    intruder: list[int] = []
    got: list[int] = []
    for batch in loader:
        got.extend(indices_of([batch]))
        if not pools:
            mine = set(_snapshot(directory)) - set(before)
            for rel in sorted(mine):
                st = os.lstat(os.path.join(directory, rel))
                pools.append({"rel": rel, "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid})
            pool_dirs = [p["rel"] for p in pools if "/" not in p["rel"]]
            for rel in pool_dirs:
                intruder.append(as_nobody(os.listdir, os.path.join(directory, rel)))
    it = loader._iterator
    del loader, it
    return {
        "planted_rc": planted_rc,
        "got": sorted(got),
        "pools": pools,
        "intruder": intruder,
        "before": before,
        "after": _snapshot(directory),
    }


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    with shared_tmp_dir() as path:
        yield path


def test_planted_names_are_never_followed_read_or_removed(shared_dir: Path) -> None:
    victim_dir = Path(tempfile.mkdtemp(prefix="stoker-test-victim-", dir="/tmp"))
    victim = victim_dir / "secret"
    victim.write_bytes(VICTIM_BYTES)
    victim.chmod(0o600)
    victim_dir.chmod(0o755)  # nobody may name the file in a symlink, not read it
    try:
        r = run_case(case_planted, directory=str(shared_dir), victim=str(victim)).result
    finally:
        data = victim.read_bytes()
        shutil.rmtree(victim_dir)
    assert r["planted_rc"] == 0, "user nobody could not plant its files"
    assert data == VICTIM_BYTES, "a planted symlink redirected a write to the victim file"
    assert r["got"] == list(range(SAMPLES))
    assert r["before"] == r["after"], "the loader changed or removed files it did not make"
    # The pool lived in one private directory of its own, every file in it private.
    dirs = [p for p in r["pools"] if "/" not in p["rel"]]
    files = [p for p in r["pools"] if "/" in p["rel"]]
    assert len(dirs) == 1 and dirs[0]["mode"] == 0o700 and dirs[0]["uid"] == 0, r["pools"]
    assert files and all(p["mode"] == 0o600 and p["uid"] == 0 for p in files), r["pools"]
    assert r["intruder"] == [REFUSED], "user nobody could list the pool's directory"


def case_stale_and_foreign(directory: str) -> dict[str, Any]:
    """Another user's leftovers and a directory of ours that cannot be removed: the loader
    still starts (reclaim used to fail every iter() on a PermissionError)."""
    os.environ["STOKER_SHM_DIR"] = directory
    loader = stoker.DataLoader(RandomDataset(40), batch_size=4, num_workers=2)
    got = sorted(indices_of(loader))
    del loader
    return {"got": got, "after": _snapshot(directory)}


def test_other_users_leftovers_neither_break_the_loader_nor_are_touched(
    shared_dir: Path,
) -> None:
    def plant() -> None:
        (shared_dir / "stoker-1-0-status").write_bytes(b"theirs")
        (shared_dir / "stoker-1-0-w0-2-1").mkdir()
        (shared_dir / "stoker-2-aaaaaaaa").mkdir()
        (shared_dir / "stoker-2-aaaaaaaa" / MARKER).write_bytes(b"")
        os.symlink("/", shared_dir / "stoker-3-root")

    assert as_nobody(plant) == 0
    (shared_dir / "stoker-4-ours" / "nested").mkdir(parents=True)
    (shared_dir / "stoker-5-bbbbbbbb").mkdir()  # ours, named like a pool, not one
    (shared_dir / "stoker-5-bbbbbbbb" / "keep").write_bytes(b"mine")
    before = _snapshot(str(shared_dir))
    r = run_case(case_stale_and_foreign, directory=str(shared_dir)).result
    assert r["got"] == list(range(40))
    assert r["after"] == before


def test_a_pool_in_use_by_a_thread_of_this_process_survives_another_loaders_start(
    shared_dir: Path,
) -> None:
    """Two loaders of one process: the second's reclaim must not take the first's pool."""
    r = run_case(case_two_loaders, directory=str(shared_dir)).result
    assert r["first"] == list(range(40)) and r["second"] == list(range(40))


def case_two_loaders(directory: str) -> dict[str, Any]:
    os.environ["STOKER_SHM_DIR"] = directory
    first = stoker.DataLoader(RandomDataset(40), batch_size=4, num_workers=2)
    it = iter(first)
    got = indices_of([next(it)])
    second: list[int] = []

    def other() -> None:
        loader = stoker.DataLoader(RandomDataset(40), batch_size=4, num_workers=1)
        second.extend(indices_of(loader))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    got.extend(indices_of(it))
    del it, first
    return {"first": sorted(got), "second": sorted(second)}


def test_a_shared_directory_without_the_sticky_bit_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the sticky bit any user could rename a live loader's pool folder away (the
    loader then died with a bare FileNotFoundError): such a directory is refused at iter()."""
    shared = tmp_path / "shm"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("STOKER_SHM_DIR", str(shared))
    loader = stoker.DataLoader(RandomDataset(8), batch_size=4, num_workers=1)
    with pytest.raises(stoker.SharedMemoryError, match=r"not sticky \(mode 0o777\).*chmod \+t"):
        iter(loader)
    assert list(shared.iterdir()) == []
    shared.chmod(0o1777)  # sticky, as /dev/shm: accepted
    assert sorted(indices_of(loader)) == list(range(8))
