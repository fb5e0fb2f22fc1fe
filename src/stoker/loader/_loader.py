"""``stoker.DataLoader``: a drop-in subclass of ``torch.utils.data.DataLoader``.

The constructor takes every argument torch's takes, with the same defaults and the same
validation errors, so ``isinstance`` checks and trainers that rebuild a loader from its
attributes keep working. Keyword-only extras come on top. With ``num_workers=0`` iteration is
torch's own; with workers it runs on stoker's engine (see ``stoker.loader._iterator``).
"""

# The parts only some loaders use (distributed, persistent workers, the backend probe) are
# imported where first used, to keep `import stoker` light.

# Over 400 lines: torch's whole constructor documented, with stoker's extras; logic is elsewhere.
from __future__ import annotations

import functools
import inspect
import os
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar, cast

import torch
import torch.utils.data as tud

from stoker.device import resolve_device, warn_pin_without_accelerator
from stoker.errors import ConfigError
from stoker.faults import Failure, FailurePolicy, OnError
from stoker.loader._arguments import check_arguments
from stoker.loader._inline import InlineIterator

# The engine is imported with stoker (5 ms of its 1.2 s), not at the first iter(): there the
# import came before a first batch the main process loads (stoker.loader._main_first), which
# torch's num_workers=0 has in 3-4 ms (tiny, 2-core VM: 8.6-9.0 ms against 2.9-3.8 with the
# import done).
from stoker.loader._iterator import MultiWorkerIterator
from stoker.loader._settings import WORKER_NICE, WorkerSettings, resolve_workers
from stoker.loader._stats import LoaderStats
from stoker.sampling._resume import EpochState, ResumeTarget, map_length

__all__ = ["Backend", "DataLoader", "Shm"]

Backend = Literal["process", "thread", "auto"]
Shm = Literal["auto", "require"]

# torch added `in_order` in 2.6; older versions must not be passed it.
_TORCH_HAS_IN_ORDER = "in_order" in inspect.signature(tud.DataLoader.__init__).parameters


_Init = TypeVar("_Init", bound=Callable[..., None])
# What a batch is, as torch's DataLoader is generic in it: ``stoker.DataLoader[Tensor]``.
_T_co = TypeVar("_T_co", covariant=True)


def _noting_given_arguments(init: _Init) -> _Init:
    """Record which arguments the caller passed, as ``self._passed_arguments``: a ``config=``
    setting applies only to an argument left out (``num_workers=0`` passed to debug in the
    main process must win over the file's workers, though 0 is also the default)."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            passed = frozenset(signature.bind(self, *args, **kwargs).arguments)
        except TypeError:  # a wrong call: __init__ raises Python's own error for it
            passed = frozenset()
        object.__setattr__(self, "_passed_arguments", passed)
        init(self, *args, **kwargs)

    return cast(_Init, wrapper)


class DataLoader(tud.DataLoader[_T_co]):
    """Combines a dataset and a sampler and iterates over batches, like torch's DataLoader.

    Every positional and keyword argument of ``torch.utils.data.DataLoader`` is accepted with
    the same meaning and default, with one difference: ``persistent_workers`` defaults to
    ``None``, which means *persistent when ``num_workers > 0``* (an explicit ``False`` is
    honoured).

    With ``num_workers > 0`` batches travel through a pool of reused shared-memory slots; any
    idle worker takes the next batch; delivery stays in sampler order unless
    ``in_order=False``; each batch's random state (``torch``, ``random``, ``numpy``) is seeded
    from the loader's base seed, the epoch and the batch index, so augmentations repeat run to
    run whatever the number of workers.

    Args:
        dataset: map-style or iterable dataset.
        batch_size: samples per batch; ``None`` disables automatic batching. Default 1.
        shuffle: reshuffle every epoch (map-style only). Default ``None`` (no shuffling).
        sampler: strategy to draw sample indices; exclusive with ``shuffle``.
        batch_sampler: yields lists of indices; exclusive with ``batch_size``, ``shuffle``,
            ``sampler`` and ``drop_last``.
        num_workers: workers; 0 loads in the main process. Default 0. ``"auto"`` starts with
            the usable cores and lets an online controller add workers while the consumer
            waits and CPU is free, and remove idle ones (see ``loader.stats().notes``).
        collate_fn: merges a list of samples into a batch. Default torch's ``default_collate``
            (``default_convert`` when ``batch_size=None``).
        pin_memory: copy batches into page-locked memory when an accelerator is present.
        drop_last: drop the last incomplete batch. Default ``False``.
        timeout: seconds to wait for one batch from the workers; 0 waits forever. Default 0.
        worker_init_fn: called in each worker with its id, after seeding, before any loading.
            A generator it reseeds (``torch.manual_seed(12345)``; ``random.seed`` or
            ``np.random.seed`` with another seed than the worker's) is reseeded per batch
            from that seed, the epoch and the batch index instead of the loader's seed
            (the same for any ``num_workers``), and ``torch.initial_seed()`` in the dataset
            returns the seed it set, as in torch.
        multiprocessing_context: start method name (``"fork"``, ``"spawn"``, ``"forkserver"``)
            or a context object. Default: the platform's default.
        generator: RNG for the sampler and the base seed.
        prefetch_factor: batches in flight per worker. Default 2 when ``num_workers > 0``.
            ``"auto"`` sizes it to absorb the measured spread of batch load times.
        persistent_workers: keep workers alive between epochs. Default ``None``: persistent
            whenever ``num_workers > 0``.
        pin_memory_device: deprecated in torch; accepted and passed on.
        in_order: deliver batches in sampler order (``True``, default) or as they complete.
        backend: where workers run: ``"process"`` (fork, forkserver or spawn; the default
            unless ``num_workers="auto"``), ``"auto"`` (the default with ``num_workers="auto"``:
            a short probe picks threads when loading waits or forked workers would copy the
            dataset, and says why in ``loader.stats().notes``; for waits, processes load
            until the training loop is seen to leave the GIL free, then threads take over) or
            ``"thread"`` (threads of this process: no pickling, no shared memory, no copies
            of the dataset; best when loading releases the GIL, e.g. decoding and I/O; global
            random generators are shared, so augmentations are not reseeded per batch).
        on_error: what a sample that raises does: ``"raise"`` (default, as torch),
            ``"skip"`` (drop it; the batch is smaller) or ``"replace"`` (load another sample
            instead; batches keep their size, unless 10 draws in a row fail: then the sample
            is skipped). Failures are listed in ``loader.failures`` in the order their
            batches are delivered (whichever worker hit them first).
        max_failures: with ``"skip"``/``"replace"``, how many failures to tolerate in one
            epoch: an int count, a float fraction of the epoch's samples seen (checked after
            100 samples, and at the epoch's end), or ``None`` (default) for no limit. Beyond
            it :class:`stoker.FailureLimitError` is raised; also, whatever the limit, at the
            end of an epoch in which every sample failed.
        max_worker_restarts: how many times a worker that dies (segfault, OOM kill) is
            replaced, its batches loaded again; default 0 raises at the first death, as torch.
        config: a ``stoker.toml`` written by ``stoker tune``; its ``[loader]`` settings apply to
            the arguments left at their defaults (an argument you pass wins).
        device: deliver batches on this device (``"cuda"``, ``"cuda:1"``, a ``torch.device``),
            copied on a side stream one or two batches ahead from page-locked slots, with the
            consumer's stream synchronised. ``None`` (default) or ``"cpu"``: host batches.
        distributed: split the dataset over the ranks of a distributed job (default ``False``,
            torch's behaviour). The rank and world size come from the initialised process
            group, else torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``. The default sampler
            becomes a :class:`stoker.RankSampler` (``shuffle`` and the ``generator``'s seed
            decide its order, new every epoch with no ``set_epoch`` needed): shares are
            disjoint and equal on every rank, so every rank runs the same number of steps;
            with ``drop_last=False`` up to ``world_size - 1`` samples are repeated to equalise
            them, with ``drop_last=True`` up to ``world_size - 1`` are dropped (pass
            ``sampler=RankSampler(..., pad=...)`` to choose otherwise). A ``sampler`` of yours
            with ``set_epoch`` (``DistributedSampler``) is kept and gets ``set_epoch`` called
            each epoch. At the first ``iter()`` the ranks compare dataset length,
            ``batch_size``, seed, ``drop_last`` and shuffle, and raise on a mismatch.
            :meth:`load_state_dict` resumes mid-epoch at another world size.
        shm: what a process worker does with a batch its shared-memory directory has no
            room for (a container's small ``/dev/shm``): ``"auto"`` (default) waits briefly
            for one of its slots to be released, then sends the batch through the pipe
            (slower, nothing lost) with one warning; ``"require"`` raises
            :class:`stoker.SharedMemoryError` instead.
        worker_nice: added to the nice value of process workers (default 19, the lowest
            priority: the training step's threads take a core from them the moment they
            wake, and workers load on what is left; 0 runs them at the training process's
            priority, as torch does). Thread workers keep the process's: a thread that holds
            the GIL must not wait for a core while the training loop waits for the GIL.

    Raises:
        ValueError: for every argument combination torch rejects, with torch's message.
        ConfigTypeError: for an argument of the wrong type (``num_workers=2.5``,
            ``in_order="no"``, ``collate_fn=3``), also those torch lets through: a
            ``TypeError`` and a ``ValueError`` both (see :mod:`stoker.loader._arguments`).
        ConfigError: for an invalid stoker extra (a ``ValueError`` too).
    """

    # Over 80 lines: torch's parameters and stoker's extras, each passed on by name.
    @_noting_given_arguments
    def __init__(
        self,
        dataset: tud.Dataset[_T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: tud.Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: tud.Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int | Literal["auto"] = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | Literal["auto"] | None = None,
        persistent_workers: bool | None = None,
        pin_memory_device: str = "",
        in_order: bool = True,
        backend: Backend | None = None,
        on_error: OnError = "raise",
        max_failures: int | float | None = None,
        max_worker_restarts: int = 0,
        config: str | os.PathLike[str] | None = None,
        device: str | torch.device | None = None,
        distributed: bool = False,
        shm: Shm = "auto",
        worker_nice: int = WORKER_NICE,
    ) -> None:
        # Over 80 lines: every argument is checked, resolved, then passed on to torch's.
        check_arguments(
            dataset=dataset,
            batch_size=batch_size,
            drop_last=drop_last,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            backend=backend,
            max_worker_restarts=max_worker_restarts,
            config=config,
            distributed=distributed,
            shm=shm,
            worker_nice=worker_nice,
        )
        if not isinstance(num_workers, str):  # a numpy int: stoker's engine tests for `int`
            num_workers = int(num_workers)
        resolved = resolve_workers(
            backend=backend,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            in_order=in_order,
            config=config,
            passed=getattr(self, "_passed_arguments", frozenset()),
        )
        backend, num_workers = resolved.backend, resolved.num_workers
        prefetch_factor, pin_memory = resolved.prefetch_factor, resolved.pin_memory
        persistent_workers, in_order = resolved.persistent_workers, resolved.in_order
        self.device = resolve_device(device)
        if pin_memory and not torch.cuda.is_available():
            warn_pin_without_accelerator()
        self._auto_workers, self._auto_prefetch = resolved.auto_workers, resolved.auto_prefetch
        self._resolved_backend: str = backend
        # A num_workers="auto" start count a tool chose (_start_with): kept as it is.
        self._start_chosen = False
        self._init_probe_state()
        policy = FailurePolicy(on_error, max_failures)
        # Set before torch's constructor, which calls `check_worker_number_rationality`.
        self.backend = backend
        if distributed:
            from stoker.loader._distributed import rank_sampler_for

            sampler, shuffle = rank_sampler_for(
                dataset,
                shuffle=shuffle,
                sampler=sampler,
                batch_sampler=batch_sampler,
                drop_last=drop_last,
                generator=generator,
            )
        extra: dict[str, Any] = {}
        if _TORCH_HAS_IN_ORDER:
            extra["in_order"] = in_order
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            **extra,
        )
        self.in_order = in_order
        self.failure_policy = policy
        # Kept as given, so that a trainer rebuilding the loader from its attributes
        # (Lightning, Accelerate) gets the same loader.
        self.on_error = on_error
        self.max_failures = max_failures
        self.config = config
        self.max_worker_restarts = max_worker_restarts
        self.shm = shm
        self.worker_nice = int(worker_nice)
        self._init_state(distributed)

    def _init_probe_state(self) -> None:
        """What the backend probe finds at the first ``iter()`` (``backend="auto"``)."""
        self._backend_notes: list[str] = []
        # The probe chose threads to cover waits: the iterator starts processes and hands over
        # to threads once the training loop leaves the GIL free (stoker.loader._switch).
        self._threads_wanted = False
        self._inline_ahead = False  # the probe chose the main process (see stoker.loader._inline)
        # The share of loading time the probe's serial pass spent waiting (None: not probed):
        # the num_workers="auto" controller starts from it (Controller.assume_blocked).
        self._probed_wait_share: float | None = None
        # (the child loading the first batch, the probe still running): for the first
        # iterator to take (stoker.loader._head).
        self._head: tuple[Any, Any] | None = None
        # That probe, left by an iterator stopped before its workers started: its answer is
        # taken at the next iter().
        self._pending_probe: Any = None

    def _init_state(self, distributed: bool) -> None:
        """The loader's own state: failures, epochs, resume, and a distributed coordinator."""
        #: Every sample that failed to load (``on_error="skip"``/``"replace"``), oldest first.
        self.failures: list[Failure] = []
        self._epoch_request: int | None = None
        self._epochs_started = 0
        self._epoch_state: EpochState | None = None
        self._resume_state: EpochState | None = None
        self._live: weakref.ref[Any] | None = None
        # The stats of the last epoch that ended, kept by its iterator (which holds this dict,
        # not the loader): once a loop's iterator is gone, stats() still describes its epoch.
        self._ended: dict[str, LoaderStats] = {}
        self.distributed = distributed
        self._coordinator: Any = None
        if distributed:
            from stoker.loader._distributed import Coordinator

            self._coordinator = Coordinator()

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Any:
        if self._coordinator is not None:  # every epoch starts here, persistent or not
            self._coordinator.begin_epoch(self)
        kept: Any = self._iterator
        if kept is not None and getattr(kept, "_main_first", None) is not None:
            # The persistent iterator whose first batch the main process loaded, left before
            # it chose between workers and the main process: it chooses now (workers go on
            # with the next epoch as they would have; the main process drops it).
            kept._finish_start()
        if self.num_workers > 0 and self._resolved_backend == "auto":
            # Before torch's __iter__: when num_workers="auto" chooses the main process, torch
            # must see num_workers=0, or it keeps the first iterator (its batches loaded ahead
            # and its sampler's pass) for the loader's life, though each epoch gets a fresh
            # one (benchmarks/memory_pss.py shows the memory).
            self._resolve_backend()
        if self._pending_probe is not None:
            probe, self._pending_probe = self._pending_probe, None
            self._finish_probe(probe, workers_started=False)
        if getattr(self._iterator, "shut_down", False):
            # Persistent workers stopped by an error the loop caught (a worker's death, say):
            # this epoch starts fresh ones, instead of failing for want of workers.
            self._iterator = None
        iterator = super().__iter__()
        if iterator is self._iterator:  # (torch keeps it only for persistent workers)
            # The persistent iterator, kept for the loader's life: the loop gets a handle on
            # this epoch; dropping it early lets the workers go idle (stoker.loader._epoch_handle).
            from stoker.loader._epoch_handle import EpochHandle

            return EpochHandle(iterator)
        return iterator

    def check_worker_number_rationality(self) -> None:
        """torch's warning about more worker processes than cores (threads are exempt, as are
        ``num_workers="auto"`` pools: their controller sizes them to the cores it measures)."""
        if getattr(self, "_resolved_backend", "process") == "process" and not getattr(
            self, "_auto_workers", False
        ):
            super().check_worker_number_rationality()

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            iterator: Any = InlineIterator(self)
        else:
            self.check_worker_number_rationality()
            iterator = MultiWorkerIterator(self)
        self._live = weakref.ref(iterator)
        return iterator

    def _start_with(self, workers: int) -> None:
        """Start a ``num_workers="auto"`` pool with ``workers`` instead of the usable cores
        (the controller takes it from there); for tools that time a given start, such as the
        bench's ramps and ``stoker tune``. Call it before the first ``iter()``.

        Raises:
            ConfigError: if the loader is not ``num_workers="auto"`` or ``workers`` is not an
                int >= 1.
        """
        if not self._auto_workers:
            raise ConfigError(
                '`_start_with` sizes a `num_workers="auto"` pool; this loader has '
                f"num_workers={self.num_workers}. Pass `num_workers` to size a fixed pool."
            )
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError(f"`workers` must be an int >= 1. Found: {workers!r}.")
        self.num_workers = workers
        self._start_chosen = True

    def _worker_settings(self) -> WorkerSettings:
        """The resolved settings an iterator with workers runs with (taken at its start)."""
        return WorkerSettings(
            backend=self._resolved_backend,
            in_order=self.in_order,
            prefetch=max(1, int(self.prefetch_factor or 2)),
            policy=self.failure_policy,
            max_worker_restarts=self.max_worker_restarts,
            device=self.device,
            mp_context=self.multiprocessing_context,
            shm_require=self.shm == "require",
            worker_init_fn=self.worker_init_fn,
            auto_workers=self._auto_workers,
            auto_prefetch=self._auto_prefetch,
            probed_wait_share=self._probed_wait_share,
            threads_wanted=self._threads_wanted,
            notes=tuple(self._backend_notes),
            nice=self.worker_nice,
        )

    def _resolve_backend(self) -> None:
        """``backend="auto"``: probe once, in a forked child, and keep the answer.

        With ``num_workers="auto"`` the answer may be to load in the main process: the loader
        then runs with ``num_workers=0`` (and says why in :meth:`stats`). A second child starts
        loading the epoch's first batch beside the probe; where the probe's warm-up finds
        batches slow, the answer is taken later, by the iterator, once that batch is delivered
        (see :mod:`stoker.loader._head`), else that child is stopped. With
        ``num_workers="auto"`` the iterator's first ``next()`` loads that batch in the main
        process instead, and the probe forks at its second (:mod:`stoker.loader._main_first`).
        """
        from stoker.loader._main_first import MainFirst

        if MainFirst.eligible(self):
            # The iterator loads its first batch here, and forks the probe at its second
            # next(): workers or the main process from then on.
            self._resolved_backend = "process"
            self._head = (MainFirst(), None)
            return
        from stoker.autotune._probe import ProbeChild, choose_backend_isolated
        from stoker.loader._head import HEAD_MIN_BATCH_S, HeadStart, wait_for_slow

        iterable = isinstance(self.dataset, tud.IterableDataset)
        collate, size = self._probe_batches()
        if iterable or not hasattr(os, "fork") or not HeadStart.eligible(self):
            detail: dict[str, Any] = {}
            backend, why = choose_backend_isolated(
                self.dataset,
                collate,
                size,
                iterable,
                allow_inline=self._auto_workers,
                detail=detail,
            )
            self._apply_probe(backend, why, detail)
            return
        # The head start loads at once, beside the probe: waiting for the probe's mark cost
        # the first batch the probe's first two samples (heavytail's first is a slow one:
        # 150 ms). Batches the warm-up finds cheap stop it unused. The probe forks first:
        # cheap batches wait for its answer, slow ones for the head start's batch.
        probe = ProbeChild.start(self.dataset, collate, size, self._auto_workers, HEAD_MIN_BATCH_S)
        head = HeadStart.start(self)
        if head is not None and wait_for_slow(probe, head, HEAD_MIN_BATCH_S):
            # Workers, whatever the answer: loading in the main process is for batches far
            # quicker than the warm-up's.
            self._resolved_backend = "process"
            self._head = (head, probe)
            return
        if head is not None:
            head.close()
        detail = {}
        backend, why = probe.answer(detail)
        self._apply_probe(backend, why, detail)

    def _probe_batches(self) -> tuple[Any, int]:
        """The collate function and batch size the backend probe loads batches with."""
        collate = self.collate_fn if self.batch_size is not None else (lambda batch: batch)
        return collate, self.batch_size or 1

    def _start_probe(self) -> Any:
        """Fork the backend probe (:class:`~stoker.autotune._probe.ProbeChild`) for the
        iterator whose first batch the main process loaded (:mod:`stoker.loader._main_first`)."""
        from stoker.autotune._probe import ProbeChild

        collate, size = self._probe_batches()
        return ProbeChild.start(self.dataset, collate, size, self._auto_workers)

    def _keep_inline(self, left: str) -> None:
        """Load in the main process for good: the first batch, loaded there, left ``left``
        open (see :mod:`stoker.loader._main_first`), which forked workers would share."""
        why = (
            f"the first batch, loaded in the main process, left {left} open there, which "
            "forked workers would share"
        )
        self._apply_probe("inline", why, {})
        warnings.warn(
            f'stoker: num_workers="auto" loads in the main process: {why} (an h5py file or '
            "an LMDB environment must be opened in each worker). Open such handles on the "
            "dataset itself, on first use (`if self.db is None: self.db = open(...)`), or "
            "in a `worker_init_fn`, or pass `num_workers=N` to load in workers from the "
            "start. (A file or thread another thread opened meanwhile is counted too.)",
            RuntimeWarning,
            stacklevel=4,
        )

    def _finish_probe(self, probe: Any, workers_started: bool = True) -> None:
        """Take the answer of a probe :meth:`_resolve_backend` left running (the iterator
        calls it once the head start's batch is delivered; ``__iter__`` when that iterator
        stopped before, ``workers_started=False``)."""
        detail: dict[str, Any] = {}
        backend, why = probe.answer(detail)
        if backend == "inline" and workers_started:  # the iterator already loads with workers
            why = f"{why}; workers all the same: the first batch was loaded beside the probe"
            backend = "process"
        self._resolved_backend = "auto"
        self._apply_probe(backend, why, detail)

    def _apply_probe(self, backend: str, why: str, detail: dict[str, Any]) -> None:
        """Resolve ``backend="auto"`` to the probe's answer."""
        self._backend_notes.append(f"backend={backend}: {why}")
        share = detail.get("wait_share")
        self._probed_wait_share = float(share) if isinstance(share, (int, float)) else None
        if backend == "thread" and detail.get("waits") and self._auto_workers:
            # Imported here: the controller's modules it brings cost 16 ms of the first
            # iter() that the main process's loading (tiny, inline) has no use for.
            from stoker.loader._switch import watch_workers

            # Threads cover waits no better than processes, and far worse while the training
            # loop runs Python (it holds the GIL they need after every wait): processes first,
            # threads once the loop is seen to leave the GIL free (see stoker.loader._switch).
            self._resolved_backend = "process"
            self._threads_wanted = True
            if not self._start_chosen:  # start at the watch's cap (see watch_workers)
                self.num_workers = max(self.num_workers, watch_workers(1 << 30))
            self._backend_notes.append(
                "processes first: threads once the training loop is seen to leave the GIL free"
            )
            return
        if backend == "inline":
            self._resolved_backend = "inline"
            self._inline_ahead = True  # stoker.loader._inline loads a few batches at a time
            self.num_workers = 0
            self._auto_workers = False
        else:
            self._resolved_backend = backend

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands, for an exact resume with :meth:`load_state_dict`.

        Taken mid-epoch, resuming delivers exactly the batches not yet delivered, with the same
        contents and randomness, whatever ``num_workers`` or ``in_order`` the resumed loader
        uses. Taken at an epoch's end (or before the first), resuming starts the next epoch.
        Put it in your checkpoint: ``torch.save({"loader": loader.state_dict(), ...}, path)``.

        Returns:
            A dictionary of plain values and tensors (picklable, ``torch.save``-able).
        """
        state = self._epoch_state
        if self._resume_state is not None:  # restored, not iterated yet: still that state
            state = self._resume_state
        elif state is None:
            state = EpochState(self._epochs_started, EpochState.capture_rng(self.generator))
        elif state.finished:
            rng = EpochState.capture_rng(self.generator)
            # (a loader that num_workers="auto" keeps in the main process gets a fresh
            # iterator each epoch, persistent_workers or not)
            persistent = bool(self.persistent_workers) and self.num_workers > 0
            state = state.after(rng, persistent=persistent)
        return state.to_dict(length=map_length(self.dataset))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter(loader)`` continues that epoch.

        With ``generator=None`` the resumed epoch restores torch's global random state as it
        was at that epoch's start (pass a ``generator`` to keep the global state untouched).

        The state is checked whole before anything changes, as untrusted input: a loader given
        a bad one is left as it was.

        Raises:
            ConfigError: if ``state_dict`` was not made by :meth:`state_dict` (a key unknown or
                missing, a value of the wrong type or out of range for this loader), or by a
                loader over a dataset of another length. The message names the key, the value
                found and the fix.
        """
        target = ResumeTarget.of(self)
        state = EpochState.from_dict(state_dict, target)
        if state.finished:
            state = EpochState(state.epoch + 1, None)
        if self.distributed:  # saved at another world size: re-partition what is left
            from stoker.loader._distributed import elastic_resume

            converted = elastic_resume(state, self)
            if converted is not state:  # its sampler state counts the batches delivered
                target.check_sampler(converted.sampler)
            state = converted
        self._resume_state = state
        self._epochs_started = state.epoch

    def set_epoch(self, epoch: int) -> None:
        """Announce the coming epoch to the sampler, the dataset and the workers.

        Calls ``set_epoch(epoch)`` on the sampler, the batch sampler (and its sampler) and the
        dataset where they define it, in the main process, and again on the dataset inside each
        persistent worker before the epoch's first batch is fetched.

        Args:
            epoch: the epoch number (an ``int`` >= 0).

        Raises:
            ConfigError: if ``epoch`` is not a non-negative ``int``.
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ConfigError(f"`epoch` must be an int >= 0. Found: {epoch!r}.")
        seen: set[int] = set()
        for obj in (
            self.sampler,
            self.batch_sampler,
            getattr(self.batch_sampler, "sampler", None),
            self.dataset,
        ):
            fn = getattr(obj, "set_epoch", None)
            if obj is not None and callable(fn) and id(obj) not in seen:
                seen.add(id(obj))
                fn(epoch)
        self._epoch_request = epoch

    def stats(self) -> LoaderStats:
        """A snapshot of the loader's internals (see :class:`stoker.LoaderStats`)."""
        iterator = self._iterator  # `or` would call len() on it
        if iterator is None and self._live is not None:
            iterator = self._live()
        if iterator is not None and hasattr(iterator, "stats"):
            return iterator.stats()
        if "stats" in self._ended:
            return self._ended["stats"]
        backend = "inline" if self.num_workers == 0 else self._resolved_backend
        return LoaderStats(
            backend="thread"
            if backend == "thread"
            else "inline"
            if backend == "inline"
            else "process",
            num_workers=self.num_workers,
            failures=len(self.failures),
            notes=tuple(self._backend_notes),
        )
