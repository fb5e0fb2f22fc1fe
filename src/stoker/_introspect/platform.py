"""Facts about this machine that decide how many workers and threads make sense.

Containers report the host's core count through ``os.cpu_count()``; what a process may really
use is bounded by its CPU affinity and by the cgroup CPU quota. Both are honoured here.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
from pathlib import Path

__all__ = [
    "THREAD_ENV_VARS",
    "affinity_cores",
    "cgroup_cpu_quota",
    "cgroup_memory_limit",
    "fs_kind",
    "fs_type",
    "open_files_limit",
    "shm_dir",
    "shm_free_bytes",
    "shm_total_bytes",
    "thread_env_vars",
    "usable_cores",
]

_CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
_CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
DEFAULT_SHM_DIR = "/dev/shm"
_CGROUP_V2_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")
_CGROUP_V1_MEMORY_LIMIT = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")
_MOUNTINFO = Path("/proc/self/mountinfo")
# Environment variables that set the size of a thread pool some library starts per process.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "TORCH_NUM_THREADS",
    "OPENCV_FOR_THREADS_NUM",
)
_NETWORK_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "9p",
        "afs",
        "gpfs",
        "beegfs",
        "virtiofs",
    }
)
_MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs"})


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


def affinity_cores() -> int | None:
    """Cores in this process's CPU affinity mask, or None where the platform has no affinity."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def shm_total_bytes(path: str | None = None) -> int:
    """Size of the shared-memory directory's filesystem (0 when it does not exist)."""
    try:
        st = os.statvfs(path or shm_dir())
    except OSError:
        return 0
    return st.f_blocks * st.f_frsize


def cgroup_memory_limit() -> int | None:
    """The cgroup memory limit in bytes, or None when unlimited or unreadable."""
    for path in (_CGROUP_V2_MEMORY_MAX, _CGROUP_V1_MEMORY_LIMIT):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        # cgroup v1 reports "no limit" as a huge number close to 2**63.
        return value if value < 2**62 else None
    return None


def open_files_limit() -> tuple[int, int]:
    """(soft, hard) limit on open file descriptors; -1 means unlimited or unknown."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    return (-1 if soft == inf else int(soft)), (-1 if hard == inf else int(hard))


def thread_env_vars() -> dict[str, str]:
    """The thread-pool environment variables that are set (name -> value)."""
    return {name: os.environ[name] for name in THREAD_ENV_VARS if name in os.environ}


def _unescape_mount(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")


def fs_type(path: str | os.PathLike[str]) -> str | None:
    """Filesystem type holding ``path`` (e.g. ``ext4``, ``nfs4``, ``tmpfs``), or None if unknown.

    Reads /proc/self/mountinfo and picks the longest mount point that contains the path.
    """
    try:
        real = os.path.realpath(os.fspath(path))
        lines = _MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    best, best_type = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        mount_point = _unescape_mount(fields[4])
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, right.split()[0]
    return best_type


def fs_kind(fstype: str | None) -> str:
    """Classify a filesystem type: ``"network"``, ``"memory"``, ``"local"`` or ``"unknown"``."""
    if fstype is None:
        return "unknown"
    if fstype in _MEMORY_FS:
        return "memory"
    base = fstype.split(".")[0]
    if base in _NETWORK_FS or (
        fstype.startswith("fuse.")
        and any(n in fstype for n in ("sshfs", "s3", "gcs", "blob", "rclone", "juice"))
    ):
        return "network"
    return "local"


def thread_sched_seconds() -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of the calling thread so far.

    From ``/proc/thread-self/schedstat`` (Linux); ``None`` where it cannot be read.
    """
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            on_cpu, queued, *_ = f.read().split()
        return int(on_cpu) / 1e9, int(queued) / 1e9
    except (OSError, ValueError):
        return None


_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int) -> None:
    """Have the kernel send this (forked) process ``signum`` when the thread that forked it
    exits (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere a no-op)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
