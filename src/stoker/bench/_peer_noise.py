"""Known teardown noise of a peer library, kept off the bench's report.

torchdata 0.11's process mapper prints tracebacks after a run's timing has ended: its
iterator's ``__del__`` runs in the worker processes it forked ("can only test a child
process"), and its sort thread reads a batch whose sender has already exited
(``FileNotFoundError``). Neither touches a measurement. While :func:`quiet_peer_teardown` is
active (``stoker bench`` only; the library never installs hooks), those two are counted instead
of printed; every other error is printed as before.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

__all__ = ["PeerNoise", "quiet_peer_teardown"]

# Where the noise comes from: frames of these packages (a path component of their files).
PEER_PACKAGES = ("torchdata",)


def _from_peer(tb: TracebackType | None, obj: object = None) -> bool:
    module = getattr(obj, "__module__", None) or ""
    if module.split(".")[0] in PEER_PACKAGES:
        return True
    for frame, _ in traceback.walk_tb(tb):
        parts = frame.f_code.co_filename.replace("\\", "/").split("/")
        if any(p in parts for p in PEER_PACKAGES):
            return True
    return False


class PeerNoise:
    """Counts of the peer errors kept off the report (in this process)."""

    def __init__(self) -> None:
        self.unraisable = 0
        self.threads = 0

    @property
    def total(self) -> int:
        return self.unraisable + self.threads


@contextmanager
def quiet_peer_teardown() -> Iterator[PeerNoise]:
    """Count, instead of printing, unraisable and thread errors raised inside a peer library.

    The hooks are inherited by processes forked meanwhile (the peer's own workers), so their
    ``__del__`` noise is kept off the report too; it is not counted there.
    """
    noise = PeerNoise()
    unraisable_before, thread_before = sys.unraisablehook, threading.excepthook

    def unraisable(u: sys.UnraisableHookArgs) -> None:
        if _from_peer(u.exc_traceback, u.object):
            noise.unraisable += 1
            return
        unraisable_before(u)

    def thread_error(args: threading.ExceptHookArgs) -> None:
        if _from_peer(args.exc_traceback):
            noise.threads += 1
            return
        thread_before(args)

    sys.unraisablehook, threading.excepthook = unraisable, thread_error
    try:
        yield noise
    finally:
        sys.unraisablehook, threading.excepthook = unraisable_before, thread_before
