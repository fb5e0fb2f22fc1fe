"""Exact mid-epoch resume: the state is a function of the sampler, not of the workers.

Batches are dispatched by index and each batch's randomness comes from (epoch seed, batch
index), so an epoch is fully described by the random state at its start (the loader's
``generator``, or torch's global generator when there is none), the sampler's own state when it
has one, and the set of batch indices already delivered. Resuming replays the sampler from
that state and skips the delivered batches, with any ``num_workers`` or ``in_order``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from stoker.errors import ConfigError

__all__ = ["EpochState", "stateful", "warn_fast_forward"]

_VERSION = 1


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
        from stoker._seeding import draw_base_seed

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
        if self.sampler is None:
            return
        for obj in (sampler, getattr(sampler, "sampler", None)):
            fn = getattr(obj, "load_state_dict", None)
            if callable(fn):
                fn(self.sampler)
                return

    # -- (de)serialisation -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
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
            self.KEY_DELIVERED: {"prefix": prefix, "rest": ordered[prefix:]},
            self.KEY_FINISHED: self.finished and not ahead,
            self.KEY_BASE_SEED: self.base_seed,
            self.KEY_ITER_EPOCH: self.iter_epoch,
            self.KEY_WORKER_STATES: dict(self.worker_states),
            self.KEY_WORKERS: self.workers,
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
    def from_dict(cls, state: Any) -> EpochState:
        """Validate a dictionary made by :meth:`to_dict`.

        Raises:
            ConfigError: if ``state`` is not such a dictionary.
        """
        keys = (cls.KEY_VERSION, cls.KEY_EPOCH, cls.KEY_RNG, cls.KEY_DELIVERED, cls.KEY_FINISHED)
        if not isinstance(state, dict) or any(k not in state for k in keys):
            raise ConfigError(
                "`state_dict` must be a dictionary returned by `stoker.DataLoader.state_dict()`"
                f". Found: {type(state).__name__} with keys "
                f"{sorted(state) if isinstance(state, dict) else '-'}."
            )
        if state[cls.KEY_VERSION] != _VERSION:
            raise ConfigError(
                f"This loader state has version {state[cls.KEY_VERSION]!r}; this stoker reads "
                f"version {_VERSION}. Resume with the stoker version that saved it."
            )
        delivered = state[cls.KEY_DELIVERED]
        done = set(range(int(delivered["prefix"]))) | {int(i) for i in delivered["rest"]}
        return cls(
            epoch=int(state[cls.KEY_EPOCH]),
            rng=state[cls.KEY_RNG],
            sampler=state.get(cls.KEY_SAMPLER),
            delivered=done,
            finished=bool(state[cls.KEY_FINISHED]),
            base_seed=state.get(cls.KEY_BASE_SEED),
            iter_epoch=int(state.get(cls.KEY_ITER_EPOCH, 0)),
            worker_states={int(k): v for k, v in state.get(cls.KEY_WORKER_STATES, {}).items()},
            workers=int(state.get(cls.KEY_WORKERS, 0)),
        )


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
