"""A pool's private directory: permissions, refusing planted files, and reclaiming by lock."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _users import REFUSED, as_nobody, shared_tmp_dir
from stoker.transport import (
    MARKER,
    PoolNamespace,
    create_private_file,
    open_private_file,
    reclaim_stale_pools,
)
from stoker.workers._queue import TaskQueue

# How long a child holding a pool may take to say where it is.
CHILD_READY_S = 30.0
HOLDER = """
import sys, time
from stoker.transport import PoolNamespace
ns = PoolNamespace.create(sys.argv[1])
with open(ns.file("slot"), "wb") as f:
    f.write(b"x" * 4096)
print(ns.path, flush=True)
time.sleep(120)
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    with shared_tmp_dir() as path:
        yield path


def start_holder(directory: Path, *prefix: str) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", HOLDER, str(directory)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, f"the holder printed nothing (exit {proc.poll()})"
    return proc, Path(line)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(CHILD_READY_S)
    if proc.stdout is not None:
        proc.stdout.close()


# -- the directory -------------------------------------------------------------------------


def test_pool_directory_is_private_random_and_removed_with_its_files(shared_dir: Path) -> None:
    a = PoolNamespace.create(str(shared_dir))
    b = PoolNamespace.create(str(shared_dir))  # same pid, same parent: no collision
    try:
        assert a.path != b.path
        for ns in (a, b):
            st = os.lstat(ns.path)
            assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
            assert st.st_uid == os.geteuid()
            name = os.path.basename(ns.path)
            assert name.startswith(f"stoker-{os.getpid()}-") and len(name) > len(
                f"stoker-{os.getpid()}-"
            )
        os.close(create_private_file(a.file("slot")))
        assert stat.S_IMODE(os.stat(a.file("slot")).st_mode) == 0o600
        a.close()
        assert not os.path.exists(a.path)
        assert os.path.isdir(b.path), "closing one pool removed another of the same pid"
    finally:
        a.close()
        b.close()


def test_another_user_can_neither_enter_nor_plant_in_a_pool(shared_dir: Path) -> None:
    ns = PoolNamespace.create(str(shared_dir))
    try:
        os.close(create_private_file(ns.file("slot")))

        def list_it() -> None:
            os.listdir(ns.path)

        def plant() -> None:
            os.symlink("/etc/passwd", os.path.join(ns.path, "planted"))

        def read_slot() -> None:
            with open(ns.file("slot"), "rb"):
                pass

        for attempt in (list_it, plant, read_slot):
            assert as_nobody(attempt) == REFUSED, f"user nobody could {attempt.__name__}"
    finally:
        ns.close()


# -- files ---------------------------------------------------------------------------------


def test_create_private_file_refuses_planted_symlink_and_fifo(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret")
    victim.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for planted in (link, fifo):
        with pytest.raises(FileExistsError):
            create_private_file(str(planted), os.O_WRONLY)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(FileExistsError):
        create_private_file(str(dangling), os.O_WRONLY)
    assert not (tmp_path / "would-be-created").exists()
    assert victim.read_bytes() == b"secret"


def test_open_private_file_refuses_symlink_and_fifo_without_blocking(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"data")
    link = tmp_path / "link"
    link.symlink_to(target)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    for planted in (link, fifo, tmp_path):
        with pytest.raises(OSError):
            os.close(open_private_file(str(planted)))
    assert time.monotonic() - t0 < 5.0, "opening a planted FIFO blocked"
    fd = open_private_file(str(target))
    try:
        assert os.read(fd, 10) == b"data"
    finally:
        os.close(fd)


def test_task_queue_overflow_reads_only_its_own_regular_files(tmp_path: Path) -> None:
    reader, writer = os.pipe()

    class Conn:
        def __init__(self, fd: int) -> None:
            self.fd = fd

        def fileno(self) -> int:
            return self.fd

    queue = TaskQueue(Conn(reader), Conn(writer), str(tmp_path / "pool-task-"))
    try:
        big = os.urandom(10_000)
        queue.put(big)
        assert queue.get() == big
        assert not list(tmp_path.iterdir()), "the overflow file was not removed"
        # A FIFO planted at the next overflow name: the write refuses it, nothing is read.
        os.mkfifo(tmp_path / "pool-task-2")
        with pytest.raises(FileExistsError):
            queue.put(big)
        # Records that name a file outside the queue's own: refused before any open.
        outside = tmp_path.parent / "outside.bin"
        outside.write_bytes(b"not a task")
        for name in (b"../outside.bin", str(outside).encode(), b"other-1"):
            record = (0xFFFFFFFF).to_bytes(4, "little") + len(name).to_bytes(4, "little") + name
            with pytest.raises(ValueError, match="not one of this queue's files"):
                queue._decode(record.ljust(4096, b"\0"))
        assert outside.read_bytes() == b"not a task"
    finally:
        os.close(reader)
        os.close(writer)


# -- reclaim -------------------------------------------------------------------------------


def test_stale_pool_of_a_killed_process_is_reclaimed(shared_dir: Path) -> None:
    proc, path = start_holder(shared_dir)
    try:
        report = reclaim_stale_pools(str(shared_dir))
        assert path.is_dir() and report.live == 1 and report.removed == 0, report
    finally:
        stop(proc)  # SIGKILL: no cleanup ran
    assert path.is_dir(), "the killed holder removed its pool itself"
    report = reclaim_stale_pools(str(shared_dir))
    assert report.removed == 1, report
    assert not path.exists()


def test_live_pool_in_another_pid_namespace_is_never_reclaimed(shared_dir: Path) -> None:
    """Containers sharing /dev/shm but not pids: the other pool's pid means nothing here."""
    unshare = shutil.which("unshare")
    probe = subprocess.run(
        [unshare or "unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
    )
    if unshare is None or probe.returncode != 0:
        pytest.skip("no `unshare --pid` on this machine (needs root and util-linux)")
    proc, path = start_holder(shared_dir, unshare, "--pid", "--fork", "--mount-proc")
    try:
        # Pid 1 in its namespace; here, pid 1 is init, alive, or any process: it does not matter.
        assert path.name.startswith("stoker-1-"), path.name
        for _ in range(3):
            report = reclaim_stale_pools(str(shared_dir))
            assert report.live == 1 and report.removed == 0, report
        assert (path / "slot").read_bytes() == b"x" * 4096
    finally:
        stop(proc)
    # The namespace's pid 1 dies after `unshare` itself: its lock goes with it.
    deadline = time.monotonic() + CHILD_READY_S
    while reclaim_stale_pools(str(shared_dir)).live and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not path.exists(), "the pool of a killed process was not reclaimed"


def test_reclaim_leaves_other_users_entries_and_never_raises(shared_dir: Path) -> None:
    def plant() -> None:
        (shared_dir / "stoker-1-aaaaaaaa").write_bytes(b"theirs")
        (shared_dir / "stoker-2-bbbbbbbb").mkdir()
        (shared_dir / "stoker-2-bbbbbbbb" / MARKER).write_bytes(b"")
        (shared_dir / "stoker-2-bbbbbbbb" / "f").write_bytes(b"theirs")
        os.symlink("/etc", shared_dir / "stoker-3-cccccccc")
        os.mkfifo(shared_dir / "stoker-4-dddddddd")

    assert as_nobody(plant) == 0
    own_file = shared_dir / "stoker-5-eeeeeeee"  # ours, but not a pool directory
    own_file.write_bytes(b"mine")
    own_dir = shared_dir / "stoker-7-ffffffff"  # a folder of ours named like a pool: no marker
    own_dir.mkdir()
    (own_dir / "notes.txt").write_bytes(b"mine")
    stuck = shared_dir / "stoker-6-gggggggg"  # a stale pool with a directory inside: cannot go
    (stuck / "sub").mkdir(parents=True)
    (stuck / MARKER).write_bytes(b"")
    unrelated = shared_dir / "stoker-anything"  # not a pool's name at all: never looked at
    unrelated.mkdir()
    report = reclaim_stale_pools(str(shared_dir))
    assert report.foreign == 6, report
    assert report.errors == 1 and report.removed == 0, report
    assert (shared_dir / "stoker-1-aaaaaaaa").read_bytes() == b"theirs"
    assert (shared_dir / "stoker-2-bbbbbbbb" / "f").read_bytes() == b"theirs"
    assert os.path.islink(shared_dir / "stoker-3-cccccccc")
    assert stat.S_ISFIFO(os.lstat(shared_dir / "stoker-4-dddddddd").st_mode)
    assert own_file.read_bytes() == b"mine"
    assert (own_dir / "notes.txt").read_bytes() == b"mine"
    assert unrelated.is_dir()
    assert reclaim_stale_pools(str(shared_dir / "missing")).errors == 1
