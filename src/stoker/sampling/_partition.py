"""The partition of an epoch's global order over ranks (pure functions, property-tested).

See :mod:`stoker.sampling._samplers` for the picture: one seed-determined global order per epoch,
interleaved or block shares of equal length (padded by repetition or truncated), and progress
kept as ranges of consumed global positions so that a remainder can be partitioned again over
another world size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from stoker.errors import ConfigError

__all__ = [
    "LAYOUTS",
    "Layout",
    "consume",
    "partition",
    "positions_to_ranges",
    "ranges_to_positions",
    "rank_positions",
    "shard_order",
    "share_size",
]

Layout = Literal["interleave", "block"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


def share_size(length: int, world_size: int, pad: bool) -> int:
    if pad:
        return -(-length // world_size) if length > 0 else 0
    return length // world_size


def rank_positions(
    length: int, world_size: int, rank: int, *, pad: bool, layout: Layout = "interleave"
) -> np.ndarray:
    """Positions ``0 <= p < length`` of an order that ``rank`` takes.

    Every rank gets the same count: ``ceil(length / world_size)`` with ``pad=True`` (the
    positions past ``length`` wrap around to the start, so a few are repeated) or
    ``floor(length / world_size)`` with ``pad=False`` (the last ``length % world_size``
    positions are dropped). ``layout="interleave"`` deals positions round-robin (rank ``r``
    takes ``r, r + world_size, ...``), so the positions consumed after every rank took ``m``
    form a prefix; ``"block"`` gives each rank one contiguous run (whole shards stay together).

    Args:
        length: positions in the order (>= 0).
        world_size: number of ranks (>= 1).
        rank: the rank, ``0 <= rank < world_size``.
        pad: repeat positions (``True``) or drop them (``False``) to equalise the counts.
        layout: ``"interleave"`` (default) or ``"block"``.

    Returns:
        An int64 array of positions, in the order the rank visits them.

    Raises:
        ConfigError: if an argument is out of range.
    """
    if not isinstance(length, int) or length < 0:
        raise ConfigError(f"`length` must be an int >= 0. Found: {length!r}.")
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"`world_size` must be an int >= 1. Found: {world_size!r}.")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"`rank` must be in [0, {world_size}). Found: {rank!r}.")
    if layout not in LAYOUTS:
        raise ConfigError(f"`layout` must be one of {LAYOUTS}. Found: {layout!r}.")
    share = share_size(length, world_size, pad)
    if layout == "interleave":
        slots = np.arange(rank, share * world_size, world_size, dtype=np.int64)
    else:
        slots = np.arange(rank * share, (rank + 1) * share, dtype=np.int64)
    return slots % length if length else slots


def partition(
    length: int, world_size: int, *, pad: bool, layout: Layout = "interleave"
) -> list[np.ndarray]:
    """:func:`rank_positions` for every rank, in rank order (see there)."""
    return [
        rank_positions(length, world_size, r, pad=pad, layout=layout) for r in range(world_size)
    ]


def shard_order(sizes: Sequence[int], seed: int, epoch: int, *, shuffle: bool) -> np.ndarray:
    """A global order that keeps shards together: shards shuffled, then samples within each.

    Args:
        sizes: samples per shard; shard ``k`` holds the indices after those of shards ``< k``.
        seed: base seed.
        epoch: the epoch.
        shuffle: ``False`` returns ``arange(sum(sizes))``.

    Returns:
        An int64 permutation of ``range(sum(sizes))``.
    """
    starts = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
    total = int(starts[-1])
    if not shuffle:
        return np.arange(total, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, 1])
    parts = []
    for shard in rng.permutation(len(sizes)):
        lo, hi = int(starts[shard]), int(starts[shard + 1])
        parts.append(lo + rng.permutation(hi - lo))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def ranges_to_positions(ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    if not ranges:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


def positions_to_ranges(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted unique positions as half-open ``(start, stop)`` ranges."""
    if positions.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [positions.size]])
    return [
        (int(positions[a]), int(positions[b - 1]) + 1) for a, b in zip(starts, stops, strict=True)
    ]


def consume(
    ranges: Sequence[tuple[int, int]],
    world_size: int,
    per_rank: int,
    *,
    pad: bool,
    layout: Layout,
) -> list[tuple[int, int]]:
    """The ranges left after every rank consumed its first ``per_rank`` positions.

    Args:
        ranges: positions of the global order still to visit, as ``(start, stop)`` ranges.
        world_size: the world those positions were partitioned over.
        per_rank: positions each rank consumed (capped at its share).
        pad: as in :func:`rank_positions`.
        layout: as in :func:`rank_positions`.

    Returns:
        The positions not consumed, as ranges (padding repeats consume nothing new).
    """
    remaining = ranges_to_positions(ranges)
    if per_rank <= 0 or remaining.size == 0:
        return list(ranges)
    share = share_size(remaining.size, world_size, pad)
    per_rank = min(per_rank, share)
    used = np.zeros(remaining.size, dtype=bool)
    for rank in range(world_size):
        used[
            rank_positions(remaining.size, world_size, rank, pad=pad, layout=layout)[:per_rank]
        ] = True
    if not pad and per_rank == share:
        # The dropped tail is not part of this epoch any more either.
        used[share * world_size :] = True
    return positions_to_ranges(remaining[~used])
