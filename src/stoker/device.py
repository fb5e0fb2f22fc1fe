"""Batches delivered on the accelerator: ``DataLoader(..., device="cuda")``.

Host batches are copied to the device on a dedicated CUDA stream, one or two batches ahead of
the consumer, as they finish loading (a batch is handed over without waiting for later ones to
load). When a batch is handed over, the consumer's current stream waits on the copy's
event, and every device tensor is marked with ``record_stream`` so the caching allocator never
reuses its memory while the consumer's stream may still use it. The host batch (its slot) is
kept until the copy's event has completed, so a slot is never reused under an in-flight copy.

With ``pin_memory=True`` (or ``device=`` on CUDA) the main process registers each shared-memory
slot as page-locked once (``cudaHostRegister``), so the copy is a true asynchronous DMA from
the slot: no pin thread, no second host copy. Where registration is refused, batches are
staged through ``Tensor.pin_memory()`` and ``loader.stats().notes`` says so.
"""

from __future__ import annotations

import collections
import gc
import os
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from stoker.errors import ConfigError

__all__ = [
    "CudaCopy",
    "DeviceStage",
    "HostRegistry",
    "make_stage",
    "resolve_device",
    "warn_pin_without_accelerator",
]

# Batches copied ahead of the consumer.
DEFAULT_DEPTH = 2
_warned_pin = False
# Stages alive in this process, and those a forked child inherited: a child keeps them to its
# end, since freeing a CUDA event there runs its destructor, which calls CUDA and aborts the
# child (any forked child: stoker's workers, torch's, the user's own).
_LIVE_STAGES: weakref.WeakSet[DeviceStage] = weakref.WeakSet()
_KEPT_IN_CHILD: list[DeviceStage] = []


# Whether this process made a stage (CUDA objects of stoker's may then be garbage in reference
# cycles), and whether the collector was paused for the fork under way.
_made_stages = False
_paused_for_fork = False


def _pause_collector() -> None:
    """Before a fork: no automatic collection between the fork and the child's handlers.

    A child's first collection (threading's own after-fork handler triggered one) freed
    inherited garbage holding CUDA tensors and events: their destructors call CUDA, which
    aborts a forked child (H200, torch's DataLoader forking after a device="cuda" epoch)."""
    global _paused_for_fork
    _paused_for_fork = _made_stages and gc.isenabled()
    if _paused_for_fork:
        gc.disable()


def _resume_collector() -> None:
    if _paused_for_fork:
        gc.enable()


def _keep_cuda_objects_in_child() -> None:
    _KEPT_IN_CHILD.extend(_LIVE_STAGES)
    if _paused_for_fork:
        gc.freeze()  # what the child inherited is never collected there, garbage included
        gc.enable()


os.register_at_fork(
    before=_pause_collector,
    after_in_parent=_resume_collector,
    after_in_child=_keep_cuda_objects_in_child,
)


def resolve_device(device: Any) -> torch.device | None:
    """Validate ``device=``: None, a string or a ``torch.device``; CPU means no copy.

    Raises:
        ConfigError: not a device, or an accelerator that is not available here.
    """
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"`device` must be None, a device string like 'cuda' or 'cuda:1', or a "
            f"torch.device. Found: {device!r}."
        ) from exc
    if dev.type == "cpu":
        return None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"`device={device!r}` but CUDA is not available on this machine: pass "
                "`device=None` (or 'cpu') to keep batches on the host."
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"`device={device!r}` but only {torch.cuda.device_count()} CUDA devices exist."
            )
        return dev
    raise ConfigError(f"`device` of type {dev.type!r} is not supported yet; use 'cuda'.")


def warn_pin_without_accelerator() -> None:
    """One warning per process: ``pin_memory=True`` does nothing without an accelerator."""
    global _warned_pin
    if _warned_pin:
        return
    _warned_pin = True
    warnings.warn(
        "stoker: `pin_memory=True` but no accelerator is present, so nothing is pinned (pinning "
        "would only cost a host copy per batch). Drop `pin_memory`, or pass `device='cuda'` on "
        "a machine with a GPU.",
        RuntimeWarning,
        stacklevel=3,
    )


class DeviceStage:
    """Issues copies ahead and hands batches over in order, errors included.

    Args:
        pull: returns the next host batch and its batch index; raises StopIteration at the end
            or whatever the loader raises (kept and re-raised in its turn).
        issue: starts the copy of a host batch; returns an opaque in-flight handle.
        complete: turns a handle into the batch to deliver (waits on the copy's event).
        finished: whether a handle's copy has completed (its host batch may be released).
        wait: blocks until a handle's copy has completed.
        depth: batches in flight ahead of the consumer.
        pending: handles of an earlier stage whose copies may still be reading their host
            batches (:meth:`pending`): kept until they complete, as this stage's own are.
        ready: whether ``pull`` would return without waiting for a batch to load (None:
            always). Copies ahead are issued only for batches that are ready: the batch a
            call hands over never waits for later ones to load (an epoch's first batch would
            otherwise wait for ``depth`` more, and the workers' start with them).
    """

    def __init__(
        self,
        pull: Callable[[], tuple[int, Any]],
        issue: Callable[[Any], Any],
        complete: Callable[[Any], Any],
        finished: Callable[[Any], bool],
        wait: Callable[[Any], None],
        depth: int = DEFAULT_DEPTH,
        pending: list[Any] | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self._pull, self._issue, self._complete, self._finished = pull, issue, complete, finished
        self._wait, self._ready = wait, ready
        self.depth = max(1, depth)
        self._ahead: collections.deque[tuple[int | None, Any, BaseException | None]] = (
            collections.deque()
        )
        # Handed over (or left by an earlier epoch): each host batch, and so its slot, is kept
        # until its copy completed; a copy queued behind the consumer's work can outlive the
        # epoch that issued it, and a slot let go earlier is refilled under the DMA.
        self._retired: list[Any] = list(pending or ())
        self._ended = False
        self._pid = os.getpid()
        _LIVE_STAGES.add(self)
        global _made_stages
        _made_stages = True

    @property
    def in_flight(self) -> list[int]:
        """Batch indices pulled from the loader but not handed to the consumer yet."""
        return [idx for idx, _, _ in self._ahead if idx is not None]

    def pending(self) -> list[Any]:
        """Handles whose copies may still be reading host memory (delivered or copied ahead)."""
        ahead = [handle for _, handle, error in self._ahead if error is None]
        return [h for h in self._retired if not self._finished(h)] + ahead

    def close(self) -> None:
        """Wait for every copy still in flight, then let go of the host batches.

        In a forked child (a stage inherited by fork) it does nothing: CUDA cannot be used
        after fork, and waiting on an event, or freeing one, aborts the child.
        """
        if os.getpid() != self._pid:
            return
        for handle in self.pending():
            self._wait(handle)
        self._retired = []
        self._ahead.clear()

    def _top_up(self, wait_for_one: bool) -> None:
        """Pull and issue until ``depth`` batches are ahead: those ``ready`` says have
        loaded, and, with ``wait_for_one``, the batch to hand over now whatever it takes."""
        while not self._ended and len(self._ahead) < self.depth:
            try:
                needed = wait_for_one and not self._ahead
                if not needed and self._ready is not None and not self._ready():
                    return
                idx, host = self._pull()
            except StopIteration:
                self._ended = True
                return
            except Exception as exc:  # delivered in its turn, after earlier batches
                self._ahead.append((None, None, exc))
                return
            self._ahead.append((idx, self._issue(host), None))

    def next(self) -> Any:
        self._retired = [h for h in self._retired if not self._finished(h)]
        self._top_up(wait_for_one=True)
        if not self._ahead:
            raise StopIteration
        _idx, handle, error = self._ahead.popleft()
        if error is not None:
            raise error
        batch = self._complete(handle)
        self._retired.append(handle)
        self._top_up(wait_for_one=False)
        return batch


class CudaCopy:
    """The CUDA side of a :class:`DeviceStage`: a side stream, events, ``record_stream``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def issue(self, host: Any) -> tuple[Any, Any, Any]:
        def copy(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            # A registered slot is pinned already; anything else is staged once.
            src = t if t.is_pinned() else t.pin_memory()
            return src.to(self.device, non_blocking=True)

        # The copies wait for work the consumer queued on its stream before this point.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dev = tree_map(copy, host)
            event = torch.cuda.Event()
            event.record(self.stream)
        return dev, event, host

    def complete(self, handle: tuple[Any, Any, Any]) -> Any:
        dev, event, _host = handle
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)

        def mark(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                t.record_stream(consumer)
            return t

        tree_map(mark, dev)
        return dev

    @staticmethod
    def finished(handle: tuple[Any, Any, Any]) -> bool:
        return bool(handle[1].query())

    @staticmethod
    def wait(handle: tuple[Any, Any, Any]) -> None:
        handle[1].synchronize()


class HostRegistry:
    """Registers shared-memory slots as page-locked memory, once each.

    ``register(addr, size)`` returns False where the driver refuses (then batches are staged
    through ``pin_memory()``); ``unregister`` is called when a slot is unmapped.
    """

    def __init__(self) -> None:
        self.refused = 0
        self.registered: set[int] = set()
        self._pid = os.getpid()

    def register(self, addr: int, size: int) -> bool:
        if addr in self.registered:
            return True
        try:
            err = torch.cuda.cudart().cudaHostRegister(addr, size, 0)
        except Exception:
            self.refused += 1
            return False
        if int(err) != 0:
            self.refused += 1
            return False
        self.registered.add(addr)
        return True

    def unregister(self, addr: int) -> None:
        if addr in self.registered and os.getpid() == self._pid:  # no CUDA call after fork
            self.registered.discard(addr)
            try:
                torch.cuda.cudart().cudaHostUnregister(addr)
            except Exception:
                pass


def make_stage(
    pull: Callable[[], tuple[int, Any]],
    device: torch.device,
    previous: DeviceStage | None = None,
    ready: Callable[[], bool] | None = None,
) -> DeviceStage:
    """A :class:`DeviceStage` copying to ``device`` on a CUDA side stream; it keeps the host
    batches of ``previous`` (the last epoch's stage) until their copies complete, and copies
    ahead only what ``ready`` says has loaded."""
    copier = CudaCopy(device)
    pending = previous.pending() if previous is not None else None
    return DeviceStage(
        pull,
        copier.issue,
        copier.complete,
        copier.finished,
        copier.wait,
        pending=pending,
        ready=ready,
    )
