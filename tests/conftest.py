"""Shared fixtures: every test is checked for leaked processes, shared memory and fds."""

from __future__ import annotations

import gc
import multiprocessing.resource_tracker
import os
import time
from collections.abc import Iterator

import psutil
import pytest
from hypothesis import settings

# Property tests are deterministic: the same examples every run (CI must not fail by chance);
# raise the example counts locally to search wider.
settings.register_profile("stoker", derandomize=True, database=None)
settings.load_profile("stoker")

SHM_DIR = "/dev/shm"
SHM_PREFIX = "stoker-"
# How long a test's children may take to exit after the test ends.
LEAK_GRACE_S = 5.0
# Extra tries of a test marked `measures` (it asserts a duration, rate or probe decision).
MEASURES_RERUNS = 1


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _shm_entries() -> set[str]:
    # Only this process's pools (their names carry the owner's pid): other processes on the
    # machine (parallel test runs) may hold live pools of their own.
    mine = f"{SHM_PREFIX}{os.getpid()}-"
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(mine)}
    except FileNotFoundError:
        return set()


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker_running() -> None:
    """Start multiprocessing's resource tracker before the first test.

    It starts the first time a spawn/forkserver child or a shared-memory segment needs it and
    then lives for the whole session; started here, the leak check never blames the test that
    happened to need it first.
    """
    multiprocessing.resource_tracker.ensure_running()


@pytest.fixture(scope="module")
def cuda_initialized() -> None:
    """CUDA's runtime opens its files once per process, at first use: done before the leak
    check's baseline (a wider scope is set up first), a GPU test is not blamed for them."""
    import torch

    if torch.cuda.is_available():
        host = torch.ones(1024).pin_memory()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves child processes, stoker shm segments or open fds behind
    (``@pytest.mark.allow_leaks``: none checked; ``allow_leaks("fds")``: all but fds)."""
    marker = request.node.get_closest_marker("allow_leaks")
    if marker is not None and not marker.args:
        yield
        return
    allowed = set(marker.args) if marker is not None else set()
    if allowed - {"fds"}:
        raise pytest.UsageError(f'allow_leaks takes "fds" or nothing. Found: {marker.args!r}.')
    check_fds = "fds" not in allowed
    children, shm, fds = _children(), _shm_entries(), _fd_count()
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    first = True
    while True:
        if not first:  # collecting is slow: only when something looks leaked
            gc.collect()
        first = False
        new_children = _children() - children
        new_shm = _shm_entries() - shm
        new_fds = _fd_count() - fds
        leaked_fds = check_fds and new_fds > 0
        if not (new_children or new_shm or leaked_fds) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    problems = []
    if new_children:
        problems.append(f"child processes left running: {sorted(new_children)}")
    if new_shm:
        problems.append(f"shared-memory entries left in {SHM_DIR}: {sorted(new_shm)}")
    if leaked_fds:
        problems.append(f"{new_fds} more open file descriptors than before the test")
    if problems:
        pytest.fail("resource leak: " + "; ".join(problems), pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        'allow_leaks(*kinds): skip the leak check for this test (for "fds" only, when given)',
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    for item in items:
        # A test that measures this machine may lose a race with a neighbour's load: it runs
        # everywhere (CI too) and gets one more try before it fails.
        if "measures" in item.keywords and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=MEASURES_RERUNS))
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
