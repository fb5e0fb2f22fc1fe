"""A second user and a shared directory, for tests of what another user can plant or read."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# uid and gid of user nobody: root may become it without an account in /etc/passwd.
NOBODY = 65534
# Exit status of an action that raised as nobody (0: it returned).
REFUSED = 3


def as_nobody(fn: Callable[..., Any], *args: Any) -> int:
    """Run ``fn(*args)`` in a forked child with uid and gid nobody; 0 if it returned,
    :data:`REFUSED` if it raised. Skips the test when this process is not root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user (nobody)")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = REFUSED
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn(*args)
            code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@contextmanager
def shared_tmp_dir() -> Iterator[Path]:
    """A directory like /dev/shm: world-writable and sticky, reachable by any user (pytest's
    ``tmp_path`` sits under a root-only directory)."""
    path = Path(tempfile.mkdtemp(prefix="stoker-test-shm-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
