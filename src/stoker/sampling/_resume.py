"""Exact mid-epoch resume: the state is a function of the sampler, not of the workers.

Batches are dispatched by index and each batch's randomness comes from (epoch seed, batch
index), so an epoch is fully described by the random state at its start (the loader's
``generator``, or torch's global generator when there is none), the sampler's own state when it
has one, and the set of batch indices already delivered. Resuming replays the sampler from
that state and skips the delivered batches, with any ``num_workers`` or ``in_order``.

A saved state is untrusted input (a checkpoint from elsewhere, or a corrupted one): it is
checked whole against the loader it is loaded into before anything changes, and no allocation
grows with a number it claims; every flaw is a ``ConfigError`` naming the key, the value found
and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.data as tud

from stoker.errors import ConfigError
from stoker.sampling._samplers import RankSampler
from stoker.sampling._seeding import draw_base_seed
from stoker.sampling._state_check import COUNT_LIMIT, StateCheck, key_path, shown

__all__ = [
    "UNSIZED_BATCHES_LIMIT",
    "EpochState",
    "ResumeTarget",
    "map_length",
    "stateful",
    "warn_fast_forward",
]

_VERSION = 1

#: Delivered batches a state may claim for a loader whose epoch has no length (an iterable
#: dataset, a sampler without ``__len__``). Resuming builds the set of them, as the saving loader
#: held it; 2**24 batches take about 1 GiB, the most a corrupted count can make it allocate.
UNSIZED_BATCHES_LIMIT = 1 << 24
#: Base seeds are drawn as torch draws them: an int64 in [0, 2**63).
_SEED_LIMIT = (1 << 63) - 1

_FIX = (
    "This state was saved by a loader over a different dataset, or is corrupted: pass the "
    "state saved by the same loader."
)


def map_length(dataset: Any) -> int | None:
    """A map-style dataset's length (None: an iterable dataset, or one without a length)."""
    if isinstance(dataset, tud.IterableDataset):
        return None
    try:
        length = len(dataset)
    except (TypeError, NotImplementedError):
        return None
    return length if isinstance(length, int) and length >= 0 else None


def _loads_state(sampler: Any) -> Any:
    """What takes a saved sampler state: the sampler, or a batch sampler's sampler."""
    for obj in (sampler, getattr(sampler, "sampler", None)):
        if callable(getattr(obj, "load_state_dict", None)):
            return obj
    return None


def _batches_at_most(index_sampler: Any) -> int | None:
    """The most batches an epoch over ``index_sampler`` has (None: it has no length)."""
    inner = getattr(index_sampler, "sampler", None)
    if isinstance(index_sampler, RankSampler):  # its length depends on the world size:
        return index_sampler.samples_at_most()  # at one rank it is longest
    if isinstance(inner, RankSampler):
        size = getattr(index_sampler, "batch_size", None)
        per_batch = size if isinstance(size, int) and size > 0 else 1
        return -(-inner.samples_at_most() // per_batch)
    try:
        batches = len(index_sampler)
    except (TypeError, NotImplementedError):
        return None
    return batches if isinstance(batches, int) and batches >= 0 else None


@dataclass(frozen=True)
class ResumeTarget:
    """What the loader a state is loaded into allows: read from it once, so the checks of
    :meth:`EpochState.from_dict` are pure.

    Attributes:
        length: the map-style dataset's length (None: iterable, or no ``__len__``).
        batches: the most batches one of its epochs has (None: unknown, an iterable dataset or
            a sampler without ``__len__``).
        generator: the loader's ``generator`` (None: torch's global one).
        sampler: what takes the saved sampler state (None: nothing does).
    """

    length: int | None
    batches: int | None
    generator: torch.Generator | None
    sampler: Any

    @classmethod
    def of(cls, loader: Any) -> ResumeTarget:
        index = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
        return cls(
            length=map_length(loader.dataset),
            batches=_batches_at_most(index),
            generator=loader.generator,
            sampler=_loads_state(index),
        )

    def check_rng(self, check: StateCheck, rng: Any) -> torch.Tensor | None:
        """A copy of a saved generator state, once this loader's generator takes it."""
        if rng is None:
            return None
        size = EpochState.capture_rng(self.generator).numel()
        if (
            not isinstance(rng, torch.Tensor)
            or rng.dtype != torch.uint8
            or rng.dim() != 1
            or rng.device.type != "cpu"
            or rng.numel() != size
        ):
            check.fail(key_path(EpochState.KEY_RNG), rng, f"None or a uint8 tensor of {size} bytes")
        device = self.generator.device if self.generator is not None else "cpu"
        try:
            torch.Generator(device=device).set_state(rng)  # a scratch one: torch checks it
        except RuntimeError as exc:
            check.fail(key_path(EpochState.KEY_RNG), rng, f"a valid generator state ({exc})")
        return rng.clone()

    def check_sampler(self, saved: Any, check: StateCheck | None = None) -> Any:
        """A saved sampler state, once the sampler that is to take it accepts it (only
        :class:`stoker.RankSampler` can say so before taking it; others take theirs as is).

        Raises:
            ConfigError: if it does not, or there is a state and no sampler to take it.
        """
        check = check or StateCheck("state_dict", _FIX)
        if saved is None:
            return None
        if self.sampler is None:
            check.fail(
                key_path(EpochState.KEY_SAMPLER),
                saved,
                "None for this loader, whose sampler has no `load_state_dict`",
            )
        if isinstance(self.sampler, RankSampler):
            self.sampler._checked_state(saved, f"{check.name}{key_path(EpochState.KEY_SAMPLER)}")
        return saved


@dataclass
class EpochState:
    """Where an epoch stands.

    Attributes:
        epoch: epochs started before this one (0 for the first).
        rng: random state at the epoch's start (a uint8 tensor), or None.
        sampler: the sampler's ``state_dict()`` at the epoch's start, if it has one.
        delivered: batch indices of this epoch already handed to the consumer.
        finished: the epoch ran to its end.
        base_seed: the iterator's base seed (None: draw a fresh one, as a new iterator does).
        iter_epoch: epochs the iterator had started before this one (persistent workers).
        worker_states: iterable datasets with ``state_dict``: each worker's dataset state
            after the last batch of it that was delivered (worker id -> state).
        workers: the saving loader's worker count (its worker states need the same count).
    """

    # Keys of the saved dictionary.
    KEY_VERSION = "version"
    KEY_EPOCH = "epoch"
    KEY_RNG = "rng"
    KEY_SAMPLER = "sampler"
    KEY_DELIVERED = "delivered"
    KEY_FINISHED = "finished"
    KEY_BASE_SEED = "base_seed"
    KEY_ITER_EPOCH = "iter_epoch"
    KEY_WORKER_STATES = "worker_states"
    KEY_WORKERS = "workers"
    KEY_LENGTH = "length"  # the map-style dataset's length (None: none known)
    KEYS = (
        KEY_VERSION,
        KEY_EPOCH,
        KEY_RNG,
        KEY_SAMPLER,
        KEY_DELIVERED,
        KEY_FINISHED,
        KEY_BASE_SEED,
        KEY_ITER_EPOCH,
        KEY_WORKER_STATES,
        KEY_WORKERS,
        KEY_LENGTH,
    )
    # Written since the first version; the others default when absent (older states).
    REQUIRED_KEYS = (KEY_VERSION, KEY_EPOCH, KEY_RNG, KEY_DELIVERED, KEY_FINISHED)
    # Keys of the saved ``delivered`` dictionary: batches 0..prefix-1, and the others.
    KEY_PREFIX = "prefix"
    KEY_REST = "rest"

    epoch: int
    rng: torch.Tensor | None
    sampler: Any = None
    delivered: set[int] = field(default_factory=set)
    finished: bool = False
    base_seed: int | None = None
    iter_epoch: int = 0
    worker_states: dict[int, Any] = field(default_factory=dict)
    workers: int = 0
    # Batches pulled for the device stage but not handed to the consumer yet: not delivered.
    in_flight: Any = None

    # -- random state ----------------------------------------------------------------------

    @staticmethod
    def capture_rng(generator: torch.Generator | None) -> torch.Tensor:
        return (generator.get_state() if generator is not None else torch.get_rng_state()).clone()

    def restore_rng(self, generator: torch.Generator | None) -> None:
        if self.rng is None:
            return
        if generator is not None:
            generator.set_state(self.rng)
        else:
            torch.set_rng_state(self.rng)

    def restore(self, generator: torch.Generator | None, sampler: Any) -> tuple[int, int]:
        """Put the random state and the sampler back; returns ``(base seed, iter epoch)``.

        Replays the draws that followed the saved state: an iterator's first epoch began with
        its base-seed draw (kept, or drawn afresh when the state has none); later epochs of a
        persistent iterator draw nothing.
        """
        self.restore_rng(generator)
        self.restore_sampler(sampler)
        if self.base_seed is None or self.iter_epoch == 0:
            drawn = draw_base_seed(generator)
        if self.base_seed is not None:
            return int(self.base_seed), self.iter_epoch
        return drawn, 0

    @staticmethod
    def capture_sampler(sampler: Any) -> Any:
        for obj in (sampler, getattr(sampler, "sampler", None)):
            fn = getattr(obj, "state_dict", None)
            if callable(fn):
                return fn()
        return None

    def restore_sampler(self, sampler: Any) -> None:
        target = _loads_state(sampler)
        if self.sampler is not None and target is not None:
            target.load_state_dict(self.sampler)

    # -- (de)serialisation -----------------------------------------------------------------

    def to_dict(self, length: int | None = None) -> dict[str, Any]:
        """The saved dictionary; ``length``: the map-style dataset's (None: none known)."""
        ahead = set(self.in_flight()) if self.in_flight is not None else set()
        ordered = sorted(self.delivered - ahead)
        prefix = 0
        while prefix < len(ordered) and ordered[prefix] == prefix:
            prefix += 1
        return {
            self.KEY_VERSION: _VERSION,
            self.KEY_EPOCH: self.epoch,
            self.KEY_RNG: self.rng,
            self.KEY_SAMPLER: self.sampler,
            # A prefix count plus the out-of-order rest keeps in-order states tiny.
            self.KEY_DELIVERED: {self.KEY_PREFIX: prefix, self.KEY_REST: ordered[prefix:]},
            self.KEY_FINISHED: self.finished and not ahead,
            self.KEY_BASE_SEED: self.base_seed,
            self.KEY_ITER_EPOCH: self.iter_epoch,
            self.KEY_WORKER_STATES: dict(self.worker_states),
            self.KEY_WORKERS: self.workers,
            self.KEY_LENGTH: length,
        }

    def after(self, rng_now: torch.Tensor, persistent: bool) -> EpochState:
        """The state to resume from when this epoch has finished: the next one, untouched.

        A persistent iterator derives the next epoch's seed from its base seed; a new
        (non-persistent) one draws a fresh base seed, from ``rng_now``.
        """
        if persistent:
            return EpochState(
                self.epoch + 1, rng_now, None, set(), False, self.base_seed, self.iter_epoch + 1
            )
        return EpochState(epoch=self.epoch + 1, rng=rng_now)

    @classmethod
    def from_dict(cls, state: Any, target: ResumeTarget) -> EpochState:
        """Check a dictionary made by :meth:`to_dict` against the loader it is loaded into.

        Nothing is changed, whatever ``state`` holds, and nothing allocated grows with a
        number it claims: delivered batches are bounded by ``target.batches`` (or
        :data:`UNSIZED_BATCHES_LIMIT`).

        Raises:
            ConfigError: if ``state`` is not such a dictionary (a key unknown or missing, a
                value of the wrong type or out of range), or was saved over a dataset of
                another length. The message names the key, the value found and the fix.
        """
        check = StateCheck("state_dict", _FIX)
        writer = "stoker.DataLoader.state_dict()"
        check.mapping(state, "", cls.KEYS, cls.REQUIRED_KEYS, writer)
        version = state[cls.KEY_VERSION]
        if not isinstance(version, int) or isinstance(version, bool) or version != _VERSION:
            raise ConfigError(
                f"This loader state has version {shown(version)}; this stoker reads version "
                f"{_VERSION}. Resume with the stoker version that saved it."
            )
        length = state.get(cls.KEY_LENGTH)
        if length is not None:
            check.integer(length, key_path(cls.KEY_LENGTH), 0, COUNT_LIMIT)
            if length != target.length:
                now = "no length" if target.length is None else f"{target.length} samples"
                raise ConfigError(
                    f"This loader state was saved over a dataset of {length} samples; this "
                    f"loader's dataset has {now}. Resume with the dataset the state was saved "
                    "over (a resumed epoch's order depends on the dataset's length)."
                )
        epoch = check.integer(state[cls.KEY_EPOCH], key_path(cls.KEY_EPOCH), 0, COUNT_LIMIT)
        finished = check.flag(state[cls.KEY_FINISHED], key_path(cls.KEY_FINISHED))
        rng = target.check_rng(check, state[cls.KEY_RNG])
        base_seed = state.get(cls.KEY_BASE_SEED)
        if base_seed is not None:
            base_seed = check.integer(base_seed, key_path(cls.KEY_BASE_SEED), 0, _SEED_LIMIT)
        iter_epoch = check.integer(
            state.get(cls.KEY_ITER_EPOCH, 0), key_path(cls.KEY_ITER_EPOCH), 0, COUNT_LIMIT
        )
        workers = check.integer(
            state.get(cls.KEY_WORKERS, 0), key_path(cls.KEY_WORKERS), 0, COUNT_LIMIT
        )
        return cls(
            epoch=epoch,
            rng=rng,
            sampler=target.check_sampler(state.get(cls.KEY_SAMPLER), check),
            delivered=cls._check_delivered(check, state[cls.KEY_DELIVERED], target.batches),
            finished=finished,
            base_seed=base_seed,
            iter_epoch=iter_epoch,
            worker_states=cls._check_worker_states(
                check, state.get(cls.KEY_WORKER_STATES, {}), workers
            ),
            workers=workers,
        )

    @classmethod
    def _check_delivered(cls, check: StateCheck, saved: Any, batches: int | None) -> set[int]:
        path = key_path(cls.KEY_DELIVERED)
        keys = (cls.KEY_PREFIX, cls.KEY_REST)
        check.mapping(saved, path, keys, keys, "stoker.DataLoader.state_dict()")
        if batches is None:
            batches = UNSIZED_BATCHES_LIMIT
            why = ": the most a loader whose epoch has no length resumes"
        else:
            why = ": the batches in an epoch of this loader"
        prefix = check.integer(
            saved[cls.KEY_PREFIX], key_path(cls.KEY_DELIVERED, cls.KEY_PREFIX), 0, batches, why
        )
        rest = saved[cls.KEY_REST]
        rest_path = key_path(cls.KEY_DELIVERED, cls.KEY_REST)
        if not isinstance(rest, (list, tuple)) or len(rest) > batches:
            check.fail(rest_path, rest, f"a list of at most {batches} batch indices{why}")
        for i, index in enumerate(rest):
            check.integer(index, f"{rest_path}[{i}]", 0, batches - 1, why)
        return set(range(prefix)).union(rest)

    @classmethod
    def _check_worker_states(cls, check: StateCheck, saved: Any, workers: int) -> dict[int, Any]:
        """Worker id -> dataset state (opaque: the dataset's own ``load_state_dict`` reads it);
        ids below the saving loader's ``workers`` (0 for ``num_workers=0``)."""
        path = key_path(cls.KEY_WORKER_STATES)
        ids = max(workers, 1)
        if not isinstance(saved, dict) or len(saved) > ids:
            check.fail(path, saved, f"a dictionary of at most {ids} worker states")
        for wid in saved:
            if not isinstance(wid, int) or isinstance(wid, bool) or not 0 <= wid < ids:
                check.fail(path, saved, f"a dictionary keyed by worker ids in [0, {ids - 1}]")
        return dict(saved)


def warn_fast_forward(batches: int, why: str) -> None:
    """An iterable dataset resumes by loading and dropping what was delivered before."""
    import warnings

    warnings.warn(
        f"stoker: resuming an iterable dataset mid-epoch: {why}, so the {batches} batches "
        "delivered before the checkpoint are loaded again and dropped (fast-forward), which "
        "takes as long as loading them did.",
        RuntimeWarning,
        stacklevel=4,
    )


def stateful(dataset: Any) -> bool:
    """Whether an iterable dataset can save and restore its position."""
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )
