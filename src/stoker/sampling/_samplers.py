"""Rank-aware sampling for distributed data-parallel training.

An epoch has one *global order*: a permutation of the dataset's indices that depends only on
``seed`` and the epoch (and, for shard-aware ordering, the shard sizes). Ranks take disjoint
shares of it; every rank gets the same number of samples, so every rank runs the same number
of steps and no collective waits forever at the end of an epoch::

    global order   p0 p1 p2 p3 p4 p5 p6 p7 p8 p9      (a permutation of range(10))
    interleaved    rank 0: p0 p2 p4 p6 p8              rank 1: p1 p3 p5 p7 p9
    block          rank 0: p0 p1 p2 p3 p4              rank 1: p5 p6 p7 p8 p9

When the length does not divide by the world size, ``pad=True`` repeats positions from the
start of the order until it does (at most ``world_size - 1`` samples are seen twice per epoch),
and ``pad=False`` drops the last positions (at most ``world_size - 1`` samples are skipped).

Progress within an epoch is a set of global positions consumed, kept as ranges. A checkpoint
taken at one world size resumes at another: the positions not yet consumed are partitioned
again over the new world, so no sample of the epoch is lost or repeated (padding aside).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from typing import Any

import numpy as np
import torch.utils.data as tud

from stoker.errors import ConfigError
from stoker.sampling._partition import (
    Layout,
    consume,
    partition,
    ranges_to_positions,
    rank_positions,
    shard_order,
    share_size,
)
from stoker.sampling._state_check import COUNT_LIMIT, StateCheck, key_path, shown
from stoker.sampling._world import WORLD_SIZE_LIMIT, World

__all__ = ["Layout", "RankSampler", "World", "partition", "rank_positions", "shard_order"]

_STATE_VERSION = 1


# -- the sampler ------------------------------------------------------------------------------


class RankSampler(tud.Sampler[int]):
    """This rank's share of a seed-determined global order, different every epoch.

    A drop-in for ``torch.utils.data.DistributedSampler`` that needs no ``set_epoch``: each
    new iteration moves to the next epoch on its own (``stoker.DataLoader(...,
    distributed=True)`` drives it from the loader's epoch counter). Once :meth:`set_epoch` is
    called, the caller drives the epoch, as with torch's sampler.

    Shares are disjoint and cover the dataset; every rank gets the same count (see
    :func:`rank_positions` for ``pad``). :meth:`state_dict` / :meth:`load_state_dict` resume
    mid-epoch, at the same or a different world size.

    Args:
        dataset: a sized dataset, or its length.
        shuffle: shuffle the global order each epoch. Default ``True``.
        seed: base seed, identical on every rank. Default 0.
        pad: ``True`` (default) repeats up to ``world_size - 1`` samples per epoch so the
            shares are equal; ``False`` drops up to ``world_size - 1`` samples instead.
        world: the ranks to split over. Default ``None``: :meth:`World.current` at each
            iteration (so a resumed job picks up its new size).
        shard_sizes: samples per shard of a sharded dataset (default ``None``: taken from
            ``dataset.shard_sizes`` when it has one, else no shards). With shards, the global
            order shuffles shards and then samples within each shard, and each rank takes one
            contiguous run, so a rank reads whole shards where the counts allow.

    Raises:
        ConfigError: if an argument is invalid.
    """

    # Keys of the saved state.
    KEY_VERSION = "version"
    KEY_LENGTH = "length"
    KEY_SEED = "seed"
    KEY_SHUFFLE = "shuffle"
    KEY_PAD = "pad"
    KEY_LAYOUT = "layout"
    KEY_EPOCH = "epoch"
    KEY_REMAINING = "remaining"
    KEY_WORLD_SIZE = "world_size"
    KEY_CONSUMED = "consumed"
    STATE_KEYS = (
        KEY_VERSION,
        KEY_LENGTH,
        KEY_SEED,
        KEY_SHUFFLE,
        KEY_PAD,
        KEY_LAYOUT,
        KEY_EPOCH,
        KEY_REMAINING,
        KEY_WORLD_SIZE,
        KEY_CONSUMED,
    )

    def __init__(
        self,
        dataset: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        pad: bool = True,
        world: World | None = None,
        shard_sizes: Sequence[int] | None = None,
    ) -> None:
        if isinstance(dataset, int) and not isinstance(dataset, bool):
            length = dataset
        elif isinstance(dataset, Sized):
            length = len(dataset)
        else:
            raise ConfigError(
                "`dataset` must be a sized dataset or an int length. Found: "
                f"{type(dataset).__name__} without `__len__`."
            )
        if length < 0:
            raise ConfigError(f"`dataset` length must be >= 0. Found: {length}.")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"`seed` must be an int. Found: {seed!r}.")
        if world is not None and not isinstance(world, World):
            raise ConfigError(f"`world` must be a `stoker.World` or None. Found: {world!r}.")
        if shard_sizes is None:
            shard_sizes = getattr(dataset, "shard_sizes", None)
        if shard_sizes is not None:
            shard_sizes = tuple(int(s) for s in shard_sizes)
            if any(s < 0 for s in shard_sizes) or sum(shard_sizes) != length:
                raise ConfigError(
                    f"`shard_sizes` must be counts >= 0 adding up to the dataset's {length} "
                    f"samples. Found: {len(shard_sizes)} shards, {sum(shard_sizes)} samples."
                )
        self.length = length
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.pad = bool(pad)
        self.world = world
        self.shard_sizes: tuple[int, ...] | None = shard_sizes
        self.layout: Layout = "block" if shard_sizes is not None else "interleave"
        self._epoch = 0
        self._pinned = False
        # Positions of the coming (or current) iteration's order still to visit.
        self._remaining: list[tuple[int, int]] = [(0, length)] if length else []
        self._running: tuple[int, int] | None = None  # (world size, yielded) of the iteration
        self._iterations = 0

    # -- epochs ----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch of the coming iteration (of the current one while it runs)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch of the coming iteration; from now on the caller drives the epoch.

        Raises:
            ConfigError: if ``epoch`` is not an int >= 0.
        """
        self._check_epoch(epoch)
        self._pinned = True
        self._move_to(epoch)

    def follow_epoch(self, epoch: int) -> None:
        """Set the coming epoch unless :meth:`set_epoch` was called (used by the loader).

        Raises:
            ConfigError: if ``epoch`` is not an int >= 0.
        """
        self._check_epoch(epoch)
        if not self._pinned:
            self._move_to(epoch)

    @staticmethod
    def _check_epoch(epoch: int) -> None:
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ConfigError(f"`epoch` must be an int >= 0. Found: {epoch!r}.")

    def _move_to(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._epoch = epoch
            self._remaining = [(0, self.length)] if self.length else []

    # -- order and shares ------------------------------------------------------------------

    def global_order(self, epoch: int) -> np.ndarray:
        """The epoch's order of dataset indices, identical on every rank."""
        if self.shard_sizes is not None:
            return shard_order(self.shard_sizes, self.seed, epoch, shuffle=self.shuffle)
        if not self.shuffle:
            return np.arange(self.length, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch]).permutation(self.length)

    def _world(self) -> World:
        return self.world if self.world is not None else World.current()

    def _share_now(self, world: World) -> np.ndarray:
        remaining = ranges_to_positions(self._remaining)
        mine = rank_positions(
            remaining.size, world.world_size, world.rank, pad=self.pad, layout=self.layout
        )
        return remaining[mine]

    def __len__(self) -> int:
        remaining = sum(b - a for a, b in self._remaining)
        return share_size(remaining, self._world().world_size, self.pad)

    def samples_at_most(self) -> int:
        """The most samples one rank's epoch can hold, at any world size (at one rank: all)."""
        return self.length

    def __iter__(self) -> Iterator[int]:
        # A generator: nothing moves until the first index is drawn, so a loader may create
        # an iterator, restore a state and create another one.
        world = self._world()
        order = self.global_order(self._epoch)
        positions = self._share_now(world)
        self._iterations += 1
        token = self._iterations
        self._running = (world.world_size, 0)
        try:
            for count, index in enumerate(order[positions].tolist(), start=1):
                self._running = (world.world_size, count)  # counted once handed out
                yield index
        finally:
            if token == self._iterations:  # not superseded by a newer iteration
                self._running = None
        self._remaining = [(0, self.length)] if self.length else []
        if not self._pinned:
            self._epoch += 1

    def skip(self, per_rank: int) -> None:
        """Mark the first ``per_rank`` samples of every rank's share of the coming iteration as
        consumed, as lockstep training does (every rank takes one batch per step).

        The coming iteration then visits only the rest, partitioned over the world current at
        that time (which may differ from the one that consumed them).

        Args:
            per_rank: samples consumed by each rank (>= 0).

        Raises:
            ConfigError: if ``per_rank`` is negative or an iteration is running.
        """
        if not isinstance(per_rank, int) or per_rank < 0:
            raise ConfigError(f"`per_rank` must be an int >= 0. Found: {per_rank!r}.")
        if self._running is not None:
            raise ConfigError("`skip` cannot be called while the sampler is being iterated.")
        self._consume(self._world().world_size, per_rank)

    def _consume(self, world_size: int, per_rank: int) -> None:
        self._remaining = consume(
            self._remaining, world_size, per_rank, pad=self.pad, layout=self.layout
        )

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands: its epoch, the positions left and how far this rank got.

        Taken while an iteration runs, ``consumed`` counts the indices this rank has yielded;
        resuming from it on every rank assumes they all got that far (lockstep training).

        Returns:
            A dictionary of plain values.
        """
        world_size, consumed = (
            self._running if self._running is not None else (self._world().world_size, 0)
        )
        return {
            self.KEY_VERSION: _STATE_VERSION,
            self.KEY_LENGTH: self.length,
            self.KEY_SEED: self.seed,
            self.KEY_SHUFFLE: self.shuffle,
            self.KEY_PAD: self.pad,
            self.KEY_LAYOUT: self.layout,
            self.KEY_EPOCH: self._epoch,
            self.KEY_REMAINING: [list(r) for r in self._remaining],
            self.KEY_WORLD_SIZE: world_size,
            self.KEY_CONSUMED: consumed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, at this or another world size.

        The coming iteration continues the saved epoch with the positions no rank consumed,
        partitioned over the current world.

        Raises:
            ConfigError: if ``state`` is not a sampler state (a key unknown or missing, a value
                of the wrong type or out of range), or was saved for a different dataset
                length, seed, shuffle, padding or shard layout. The sampler is unchanged then.
        """
        epoch, remaining, world_size, consumed = self._checked_state(state)
        remaining = consume(remaining, world_size, consumed, pad=self.pad, layout=self.layout)
        self._epoch = epoch
        self._pinned = False
        self._running = None
        self._remaining = remaining

    def _checked_state(
        self, state: Any, name: str = "state"
    ) -> tuple[int, list[tuple[int, int]], int, int]:
        """``(epoch, remaining ranges, world size, consumed)`` of a state this sampler can
        resume from; changes nothing. ``name`` is the state's name in messages.

        Raises:
            ConfigError: as :meth:`load_state_dict`.
        """
        check = StateCheck(name, "Pass the state saved by a `RankSampler` over the same dataset.")
        check.mapping(state, "", self.STATE_KEYS, self.STATE_KEYS, "RankSampler.state_dict()")
        version = state[self.KEY_VERSION]
        if not isinstance(version, int) or isinstance(version, bool) or version != _STATE_VERSION:
            raise ConfigError(
                f"This sampler state has version {shown(version)}; this stoker reads version "
                f"{_STATE_VERSION}. Resume with the stoker version that saved it."
            )
        mine = {
            self.KEY_LENGTH: self.length,
            self.KEY_SEED: self.seed,
            self.KEY_SHUFFLE: self.shuffle,
            self.KEY_PAD: self.pad,
            self.KEY_LAYOUT: self.layout,
        }
        for key, value in mine.items():  # of the same type before they are compared
            saved = state[key]
            if isinstance(value, bool):
                same, need = isinstance(saved, bool), "True or False"
            elif isinstance(value, int):
                same, need = isinstance(saved, int) and not isinstance(saved, bool), "an int"
            else:
                same, need = isinstance(saved, str), "a string"
            if not same:
                check.fail(key_path(key), saved, f"{need} ({value!r} here)")
        diffs = [
            f"{k} saved {shown(state[k])}, now {v!r}" for k, v in mine.items() if state[k] != v
        ]
        if diffs:
            raise ConfigError(
                "Cannot resume this sampler from a state saved with different settings: "
                + "; ".join(diffs)
                + ". Resume with the same dataset and `seed`, `shuffle`, `pad` settings."
            )
        epoch = check.integer(state[self.KEY_EPOCH], key_path(self.KEY_EPOCH), 0, COUNT_LIMIT)
        world_size = check.integer(
            state[self.KEY_WORLD_SIZE], key_path(self.KEY_WORLD_SIZE), 1, WORLD_SIZE_LIMIT
        )
        # A count beyond a rank's share means the whole share (see `consume`).
        consumed = check.integer(
            state[self.KEY_CONSUMED], key_path(self.KEY_CONSUMED), 0, COUNT_LIMIT
        )
        ranges = state[self.KEY_REMAINING]
        path = key_path(self.KEY_REMAINING)
        need = f"a list of [start, stop] ranges, sorted and disjoint, within [0, {self.length}]"
        if not isinstance(ranges, (list, tuple)) or len(ranges) > self.length:
            check.fail(path, ranges, need)
        remaining: list[tuple[int, int]] = []
        low = 0
        for i, pair in enumerate(ranges):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                check.fail(f"{path}[{i}]", pair, f"a [start, stop] pair: {need}")
            start = check.integer(pair[0], f"{path}[{i}][0]", low, self.length - 1, f": {need}")
            stop = check.integer(pair[1], f"{path}[{i}][1]", start + 1, self.length, f": {need}")
            remaining.append((start, stop))
            low = stop
        return epoch, remaining, world_size, consumed

    def __repr__(self) -> str:
        return (
            f"RankSampler(length={self.length}, shuffle={self.shuffle}, seed={self.seed}, "
            f"pad={self.pad}, layout={self.layout!r}, epoch={self._epoch})"
        )
