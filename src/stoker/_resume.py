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

__all__ = ["EpochState"]

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
    """

    # Keys of the saved dictionary.
    KEY_VERSION = "version"
    KEY_EPOCH = "epoch"
    KEY_RNG = "rng"
    KEY_SAMPLER = "sampler"
    KEY_DELIVERED = "delivered"
    KEY_FINISHED = "finished"

    epoch: int
    rng: torch.Tensor | None
    sampler: Any = None
    delivered: set[int] = field(default_factory=set)
    finished: bool = False
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
        }

    def after(self, rng_now: torch.Tensor) -> EpochState:
        """The state to resume from when this epoch has finished: the next one, untouched."""
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
        )
