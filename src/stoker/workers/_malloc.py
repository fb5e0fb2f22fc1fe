"""Start a worker process with glibc's malloc where a long-running process ends up.

glibc serves an allocation over its mmap threshold (128 KiB in a fresh process) with a mapping
of its own, which the kernel fills with zeroed pages one fault at a time and which ``free``
unmaps. It raises the threshold only as such chunks are freed, up to 32 MiB on a 64-bit
machine, with a trim threshold of twice that (``mallopt(3)``). A decoder's image-sized buffers
and torch's tensors sit over 128 KiB, so a fresh worker faults in each of them until the
threshold has caught up. In the bench's jpeg workload (2 process workers, 2-core VM, the first
0.4 s after two batches, eight runs each) a fresh worker read 82-207 minor faults a sample and
ran 180-337 samples/s (median 299); started at the ceiling glibc converges to, 0-60 faults and
288-395 samples/s (median 315). Over 5 s the two run alike (medians 395 and 394 samples/s); the
cost is the heap a worker keeps between batches instead of handing back and faulting in again:
a jpeg worker's unique memory went from 75 to 90 MiB (benchmarks/README.md).

A user who tuned malloc (``MALLOC_*`` variables, ``GLIBC_TUNABLES``) is left alone, as is any
other C library. ``STOKER_WORKER_MALLOC=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform

__all__ = ["ENV_OFF", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "settle_malloc", "wanted"]

# glibc's dynamic ceiling on 64-bit machines (DEFAULT_MMAP_THRESHOLD_MAX), and the trim
# threshold it pairs with a raised mmap threshold.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
# Set to "0" to leave a worker's malloc as glibc starts it.
ENV_OFF = "STOKER_WORKER_MALLOC"
# mallopt(3) parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Set by the user, these say how malloc should behave: stoker does not overrule them.
_USER_TUNING = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "GLIBC_TUNABLES",
)


def wanted() -> bool:
    """Whether to settle this process's malloc: glibc, on 64-bit, and no user choice to keep."""
    if os.environ.get(ENV_OFF, "1") == "0":
        return False
    if any(var in os.environ for var in _USER_TUNING):
        return False
    return platform.libc_ver()[0] == "glibc" and ctypes.sizeof(ctypes.c_void_p) == 8


def settle_malloc() -> bool:
    """Set this process's mmap and trim thresholds to glibc's converged ceiling (see the module
    docstring). Returns whether both took effect."""
    if not wanted():
        return False
    with contextlib.suppress(OSError, AttributeError):
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        # The trim threshold first: setting the mmap threshold fixes both (no more adjusting).
        trimmed = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        return bool(trimmed and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return False
