"""Facts about this machine that decide how many workers and threads make sense.

Containers report the host's core count through ``os.cpu_count()``; what a process may really
use is bounded by its CPU affinity and by the cgroup CPU quota. Both are honoured here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["cgroup_cpu_quota", "shm_dir", "shm_free_bytes", "usable_cores"]

_CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
_CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
DEFAULT_SHM_DIR = "/dev/shm"


def cgroup_cpu_quota() -> float | None:
    """The cgroup CPU quota in cores (e.g. 1.5), or None when there is none or it is unreadable."""
    try:
        quota, period = _CGROUP_V2_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        q = int(_CGROUP_V1_QUOTA.read_text())
        p = int(_CGROUP_V1_PERIOD.read_text())
        if q > 0 and p > 0:
            return q / p
    except (OSError, ValueError):
        pass
    return None


def usable_cores() -> int:
    """Cores this process may run on: CPU affinity, capped by the cgroup quota (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def shm_dir() -> str:
    """The directory that holds stoker's shared-memory slots (``STOKER_SHM_DIR`` or /dev/shm)."""
    return os.environ.get("STOKER_SHM_DIR", DEFAULT_SHM_DIR)


def shm_free_bytes(path: str | None = None) -> int:
    """Free bytes in the shared-memory directory (0 when it does not exist)."""
    try:
        st = os.statvfs(path or shm_dir())
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize
