"""The iterator behind ``stoker.DataLoader`` when ``num_workers=0``.

Batches are loaded in the main process, as torch does, with stoker's promises kept: each
batch's randomness comes from (epoch seed, batch index), so augmentations equal those of any
``num_workers`` (the caller's random state is saved and restored around each batch, so its
own stream is untouched); ``on_error`` applies; the epoch can be saved and resumed exactly.
When ``num_workers="auto"`` chose the main process, batches are loaded a few at a time
(:data:`GROUP_S`), which spreads that save and restore over them.
"""

# The device stage is imported only when `device=` asks for it (start-up of `import stoker`).

from __future__ import annotations

import collections
import itertools
import time
from typing import Any

import torch
from torch.utils.data import dataloader as _torch_dl
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from stoker.faults import FailureTally
from stoker.loader._base import StokerIterBase
from stoker.loader._stats import LoaderStats
from stoker.sampling._resume import EpochState, stateful, warn_fast_forward
from stoker.sampling._seeding import CallerRandomState, batch_seed, epoch_seed, seed_all
from stoker.workers._fetch import BatchFetcher, SkipBatch

__all__ = ["GROUP_BATCHES", "GROUP_S", "InlineIterator"]

# Under num_workers="auto", most batches loaded ahead at a time, and how long a group may take
# (the caller's random state is saved and restored once per group, about 26 us; the first
# batch of a group waits for the group). 20 ms groups stalled a GPU-like step for a whole group
# at once: tiny's quick-mode train runs (0.4 s) read 13% waiting against torch's 5%, 1.15x
# slower; 2 ms groups keep the save and restore under 2% of loading.
GROUP_BATCHES = 64
GROUP_S = 0.002
_SKIPPED = object()  # a batch that loaded nothing (on_error="skip"): its failures only
_END = object()  # the sampler is exhausted


class InlineIterator(StokerIterBase):
    """Loads each batch in the calling process (see the module docstring)."""

    def __init__(self, loader: Any) -> None:
        rng_at_start = EpochState.capture_rng(loader.generator)
        super().__init__(loader)
        self._iterable = self._dataset_kind == _torch_dl._DatasetKind.Iterable
        self._policy = loader.failure_policy
        self._tally = FailureTally(self._policy, loader.failures)
        self._ended: dict[str, LoaderStats] = loader._ended
        self._notes: list[str] = getattr(loader, "_backend_notes", [])
        self._wait_s = 0.0
        self._iter_epoch = 0
        # Under num_workers="auto" (the probe chose the main process), batches are loaded a
        # few at a time under one save and restore of the caller's random state; with an
        # explicit num_workers=0 each batch is loaded when it is asked for, as torch does.
        self._group = GROUP_BATCHES if getattr(loader, "_inline_ahead", False) else 1
        self._caller_rng = CallerRandomState()
        self._begin_epoch(loader, rng_at_start, first=True)

    @classmethod
    def adopt(cls, loader: Any, it: Any, pending: tuple[int, Any] | None) -> InlineIterator:
        """An iterator that goes on with the epoch ``it`` (a
        :class:`~stoker.loader._iterator.MultiWorkerIterator` whose first batch the main
        process loaded, :mod:`stoker.loader._main_first`) began, in the main process: its
        sampler's pass, seeds, delivered batches and failures; ``pending``: ``(task, index)``
        of a batch drawn and not loaded, loaded first. The loader's random state and epoch
        count are left as ``it`` left them."""
        rng = EpochState.capture_rng(loader.generator)
        epochs, device = loader._epochs_started, loader.device
        # (a resume or set_epoch given since is the next epoch's, not this one's)
        resume, request = loader._resume_state, loader._epoch_request
        loader.device = loader._resume_state = None  # (it has its own device stage)
        try:
            self = cls(loader)  # (draws a base seed and begins an epoch: both replaced below)
        finally:
            loader.device = device
            loader._resume_state, loader._epoch_request = resume, request
            loader._epochs_started = epochs
            if loader.generator is not None:
                loader.generator.set_state(rng)
            else:
                torch.set_rng_state(rng)
        ctx = it._ctx
        self._sampler_iter = it._sampler_iter
        if pending is not None:
            self._sampler_iter = itertools.chain([pending[1]], self._sampler_iter)
        self._base_seed = it._base_seed
        self._num_yielded = it._num_yielded
        self._epoch_seed = ctx.seed
        self._task = pending[0] if pending is not None else ctx.book.issued
        self._state = ctx.state
        self._state.workers = 0
        loader._epoch_state = self._state
        self._tally = it._tally
        self._wait_s = ctx.wait_s
        self._notes = [*loader._backend_notes, *it._notes]
        return self

    def _begin_epoch(self, loader: Any, rng_at_start: torch.Tensor, first: bool) -> None:
        resume: EpochState | None = loader._resume_state
        loader._resume_state = None
        if not first:
            self._iter_epoch += 1
        if resume is not None:
            self._base_seed, self._iter_epoch = resume.restore(
                loader.generator, self._index_sampler
            )
            rng_at_start = resume.rng if resume.rng is not None else rng_at_start
            self._sampler_iter = iter(self._index_sampler)
        self._epoch_seed = epoch_seed(int(self._base_seed), self._iter_epoch)
        epoch = resume.epoch if resume is not None else loader._epochs_started
        loader._epochs_started = epoch + 1
        self._state = EpochState(
            epoch=epoch,
            rng=rng_at_start,
            sampler=EpochState.capture_sampler(self._index_sampler),
            delivered=set(resume.delivered) if resume is not None else set(),
            base_seed=int(self._base_seed),
            iter_epoch=self._iter_epoch,
            workers=0,
        )
        loader._epoch_state = self._state
        # An iterable dataset jumps to its saved position when it can (a state saved by this
        # single stream), else its stream replays what was delivered before.
        self._jump = False
        if resume is not None and resume.delivered and self._iterable:
            if not stateful(self._dataset):
                warn_fast_forward(len(resume.delivered), "it has no `state_dict`/`load_state_dict`")
            elif resume.workers != 0 or 0 not in resume.worker_states:
                warn_fast_forward(
                    len(resume.delivered),
                    f"its per-worker positions were saved by {resume.workers} workers, not by "
                    "num_workers=0",
                )
            else:
                self._jump = True
                self._dataset.load_state_dict(resume.worker_states[0])  # type: ignore[attr-defined]
                self._state.worker_states[0] = resume.worker_states[0]
        previous = getattr(self, "_device_stage", None)  # the last epoch's, if any
        self._device_stage: Any = None
        if loader.device is not None:
            from stoker.device import make_stage

            stage = make_stage(
                self._next_host, loader.device, previous=previous, ready=self._host_ready
            )
            self._device_stage = stage
            self._state.in_flight = lambda: stage.in_flight
        self._task = 0
        # Batches loaded ahead: (index, (batch, samples) or _SKIPPED, failures, the stream's
        # position after it, error to raise when it is due).
        self._ahead: collections.deque[tuple[int, Any, list[Any], Any, Any]] = collections.deque()
        self._exhausted = False
        self._wait_s = 0.0
        self._tally.new_epoch()
        self._fetcher = BatchFetcher(
            self._dataset,
            iterable=self._iterable,
            auto_collation=self._auto_collation,
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            on_error=self._policy.on_error,
        )
        set_epoch = loader._epoch_request
        loader._epoch_request = None
        del set_epoch  # the main-process dataset already got it from `loader.set_epoch`

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        rng_at_start = EpochState.capture_rng(loader.generator)
        super()._reset(loader, first_iter)
        self._begin_epoch(loader, rng_at_start, first=False)

    def _next_data(self) -> Any:
        if self._device_stage is not None:
            return self._device_stage.next()
        return self._next_host()[1]

    def _next_host(self) -> tuple[int, Any]:
        t0 = time.perf_counter()
        state = self._state
        while True:
            if not self._ahead:
                if self._exhausted:
                    state.finished = True
                    self._ended["stats"] = self.stats()
                    self._tally.end_epoch()
                    raise StopIteration
                self._load_ahead()
                continue
            idx, batch, failures, position, error = self._ahead.popleft()
            if error is not None:
                raise error
            if failures:
                self._tally.record(failures, state.epoch, 0)
            if batch is _SKIPPED:
                continue
            state.delivered.add(idx)
            if position is not None:
                state.worker_states[0] = position
            self._tally.delivered(batch[1], failures)
            batch = batch[0]
            if self._pin_memory:
                batch = _pin_memory(batch, self._pin_memory_device)
            self._wait_s += time.perf_counter() - t0
            return idx, batch

    def _host_ready(self) -> bool:
        """Whether :meth:`_next_host` would return without loading a batch here."""
        return bool(self._ahead) or self._exhausted

    def _load_ahead(self) -> None:
        """Load the next batch (the next few, under ``num_workers="auto"``), each seeded from
        its own index, with the caller's random state saved once before and restored once
        after: a save, seed and restore costs about 26 us (95 us with numpy's own
        get_state/set_state; see CallerRandomState), measured with ``timeit``.

        The first index is drawn before the save: a sampler that draws from the global
        generator (torch's ``RandomSampler`` without a ``generator`` draws its epoch's seed
        at its first index) advances the caller's stream as it does under torch, with or
        without workers. Each index is drawn that way with ``num_workers=0``; under
        ``num_workers="auto"`` the rest of a group's indices are drawn inside it.
        """
        index = self._pull_index()
        if index is _END:
            return
        saved = self._caller_rng.save()
        start = time.perf_counter()
        try:
            while self._load_one(index):
                if len(self._ahead) >= self._group or time.perf_counter() - start >= GROUP_S:
                    return
                index = self._pull_index()
                if index is _END:
                    return
        finally:
            self._caller_rng.restore(saved)

    def _pull_index(self) -> Any:
        try:
            return self._next_index()
        except StopIteration:
            self._exhausted = True
            return _END

    def _load_one(self, index: Any) -> bool:
        """Load the batch at ``index`` into ``_ahead``; False when loading must stop (the
        stream ended, or the batch raised: the error waits for its turn, as torch's does)."""
        state = self._state
        idx = self._task
        self._task += 1
        replay = idx in state.delivered
        if replay and (not self._iterable or self._jump):
            return True
        seed = batch_seed(self._epoch_seed, idx)
        seed_all(seed)
        try:
            batch, failures = self._fetcher.fetch(index, seed)
        except SkipBatch as skip:
            self._ahead.append((idx, _SKIPPED, skip.failures, None, None))
            return True
        except StopIteration:
            self._exhausted = True
            return False
        except Exception as exc:  # raised when its batch is due (torch's order)
            self._ahead.append((idx, None, [], None, exc))
            return False
        if replay:  # an iterable stream passing what was delivered before the checkpoint
            return True
        position = None
        if self._iterable and stateful(self._dataset):
            position = self._dataset.state_dict()  # type: ignore[attr-defined]
        samples = len(index) if self._auto_collation else 1
        self._ahead.append((idx, (batch, samples), failures, position, None))
        return True

    def stats(self) -> LoaderStats:
        return LoaderStats(
            backend="inline",
            num_workers=0,
            epoch=self._state.epoch,
            batches=len(self._state.delivered),
            samples=self._tally.samples,
            wait_s=self._wait_s,
            failures=len(self._tally.log),
            notes=tuple(self._notes),
        )
