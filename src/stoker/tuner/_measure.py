"""How ``stoker tune`` times a configuration: a fresh loader, or one loader resized in place.

A fresh loader per configuration (:func:`measure`) pays for starting its workers, for the
first wave of batches (every worker starts one at once, so on a few cores the first batch
waits for all of them) and for shutting down (each worker finishes the batch it is on). On
two cores that is 1 to 5 seconds a configuration against a timed window of 0.6.
:class:`WorkerSession` pays that once: it keeps one ``num_workers="auto"`` loader whose
controller is replaced by a schedule, and moves it from one worker count (and prefetch depth)
to the next, timing each after its new workers delivered their first batches. The delivered
batches never depend on the count (dispatch is by batch index), so the rates are those of
fresh loaders at those counts in their steady state.

Rates are taken between deliveries: from the delivery that ends the warm-up to the last one
in the window, over at least one batch per worker. With more workers than cores, workers
that started together finish together; a window timed by the clock alone would count one
such wave more or less depending on where it fell.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import torch
import torch.utils.data as tud

from stoker._commands.step import consume
from stoker._introspect.platform import usable_cores
from stoker.autotune._controller import BLOCKED_MIN_SPANS, Decision, Observation, workers_to_fill
from stoker.loader._loader import DataLoader

__all__ = ["WARMUP_BATCHES", "WorkerSession", "measure"]

# Batches loaded (and not timed) before a window opens, besides one per worker.
WARMUP_BATCHES = 2
# Seconds a schedule change may take to be applied (the controller runs every 0.2 s).
APPLY_TIMEOUT_S = 30.0
_ENDLESS = 10**9


def _sampler(dataset: Any, seed: int) -> tud.Sampler[int]:
    return tud.RandomSampler(
        dataset,
        replacement=True,
        num_samples=_ENDLESS,
        generator=torch.Generator().manual_seed(seed),
    )


def _loader(dataset: Any, batch_size: int, cand: Any, seed: int) -> Any:
    sampler = _sampler(dataset, seed)
    if cand is None:  # torch's defaults
        return tud.DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    if cand.num_workers == 0:
        return DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, pin_memory=cand.pin_memory
        )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=cand.num_workers,
        prefetch_factor=cand.prefetch_factor,
        pin_memory=cand.pin_memory,
        backend=cand.backend,
    )


def _timed(it: Any, seconds: float, min_batches: int) -> float:
    """Samples per second from now (just after a delivery) to the last delivery once
    ``seconds`` passed and at least ``min_batches`` arrived."""
    samples = batches = 0
    t0 = now = time.perf_counter()
    while now - t0 < seconds or batches < min_batches:
        samples += consume(next(it))
        batches += 1
        now = time.perf_counter()
    return samples / (now - t0)


def _close(loader: Any, it: Any) -> None:
    shutdown = getattr(it, "_shutdown", None) or getattr(
        getattr(loader, "_iterator", None), "_shutdown", None
    )
    if callable(shutdown):
        shutdown()


def measure(dataset: Any, batch_size: int, cand: Any, seconds: float) -> float:
    """Samples per second of one configuration in a fresh loader, over ``seconds`` (after
    each worker delivered a batch and :data:`WARMUP_BATCHES` more)."""
    loader = _loader(dataset, batch_size, cand, seed=0)
    it = iter(loader)
    try:
        workers = cand.num_workers if cand is not None else 0
        for _ in range(WARMUP_BATCHES + workers):
            consume(next(it))
        return _timed(it, seconds, max(1, workers))
    finally:
        _close(loader, it)
        del it, loader
        gc.collect()


class _Schedule:
    """Stands in for the ``num_workers="auto"`` controller: asks for the set count and depth."""

    def __init__(self, workers: int, prefetch: int) -> None:
        self.workers, self.prefetch = workers, prefetch
        self._prefetch_now = prefetch
        self.blocked = (0.0, 0.0, 0)  # sampled spans: blocked and running seconds, count

    def observe(self, obs: Observation) -> Decision | None:
        if obs.blocked_s is not None and obs.running_s is not None:
            blocked, running, count = self.blocked
            self.blocked = (blocked + obs.blocked_s, running + obs.running_s, count + obs.sampled)
        if obs.workers == self.workers and self._prefetch_now == self.prefetch:
            return None
        self._prefetch_now = self.prefetch
        return Decision(self.workers, self.prefetch, "stoker tune")


class WorkerSession:
    """One loader of ``backend`` workers, timed at one worker count after another.

    Args:
        dataset: the map-style dataset.
        batch_size: samples per batch.
        backend: ``"process"`` or ``"thread"``.
        workers: the first worker count.
        prefetch: the first prefetch depth.
    """

    def __init__(
        self, dataset: Any, batch_size: int, backend: str, workers: int, prefetch: int
    ) -> None:
        self.backend = backend
        self._loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=_sampler(dataset, seed=0),
            num_workers="auto",
            prefetch_factor=prefetch,
            backend=backend,  # type: ignore[arg-type]
        )
        self._loader._start_with(workers)
        self._it = iter(self._loader)
        scaler = getattr(self._it, "_scaler", None)
        if scaler is None:  # pragma: no cover - auto loaders over map-style datasets have one
            raise RuntimeError("the tune session's loader has no worker controller")
        scaler.end_slow_start()  # the schedule sets the counts: no slow start to time
        self._scaler = scaler
        self._schedule = _Schedule(workers, prefetch)
        scaler.controller = self._schedule
        self.workers = 0  # none has delivered yet: all count as started by the first rate()

    def rate(self, workers: int, prefetch: int, seconds: float) -> float:
        """Samples per second at ``workers`` and ``prefetch``, timed over ``seconds``."""
        started = max(0, workers - self.workers)
        self._schedule.workers, self._schedule.prefetch = workers, prefetch
        pool, scaler = self._it._pool, self._scaler
        scaler.hurry()
        deadline = time.perf_counter() + APPLY_TIMEOUT_S
        # Delivered batches drive the controller: consume until the change is in place and
        # every worker retired by it has answered.
        while scaler.running(pool) != workers or scaler.retiring or self._it._prefetch != prefetch:
            consume(next(self._it))
            if time.perf_counter() > deadline:
                raise RuntimeError(
                    f"the tune session could not move to {workers} workers within "
                    f"{APPLY_TIMEOUT_S:.0f} s"
                )
        self.workers = workers
        # The workers just started deliver their first batches (the others run on).
        for _ in range(WARMUP_BATCHES + started):
            consume(next(self._it))
        return _timed(self._it, seconds, workers)

    def fill_need(self) -> int | None:
        """:func:`~stoker.autotune._controller.workers_to_fill` for the share of loading time the
        workers spent blocked so far (process workers sample it), or None before
        :data:`stoker.autotune._controller.BLOCKED_MIN_SPANS` spans were sampled."""
        blocked, running, count = self._schedule.blocked
        if count < BLOCKED_MIN_SPANS or blocked + running <= 0:
            return None
        return workers_to_fill(usable_cores(), blocked / (blocked + running))

    def close(self) -> None:
        """Shut the loader's workers down."""
        _close(self._loader, self._it)
        del self._it
        gc.collect()
