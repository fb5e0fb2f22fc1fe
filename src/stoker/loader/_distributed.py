"""What ``stoker.DataLoader(..., distributed=True)`` adds: rank-aware sampling and its checks.

- At construction, the default sampler is replaced by a :class:`~stoker.sampling.RankSampler`
  (a user's ``DistributedSampler`` is kept).
- At the first ``iter()``, every rank sends a small fingerprint of its loader (dataset length,
  batch size, seed, ``drop_last``, shuffle) to the others over the process group; ranks that
  disagree would run different numbers of steps and hang in a collective, so they raise a
  :class:`~stoker.ConfigError` naming the ranks and values instead.
- At the start of every epoch the sampler is moved to the loader's epoch (a user's
  ``DistributedSampler`` gets ``set_epoch`` called for it, with a one-time notice) unless the
  user drives the epoch.
- On ``load_state_dict`` at a different world size, the batches delivered before the
  checkpoint become a count of samples consumed per rank, handed to the sampler, which
  partitions what is left of the epoch over the new world.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence, Sized
from typing import Any

import torch
import torch.utils.data as tud

from stoker.errors import ConfigError
from stoker.sampling import RankSampler, World
from stoker.sampling._resume import EpochState

__all__ = ["Coordinator", "check_fingerprints", "elastic_resume", "rank_sampler_for"]

# Fingerprint fields, in the order an error lists them.
FINGERPRINT_FIELDS = ("dataset length", "batch_size", "seed", "drop_last", "shuffle")


def _seed_of(generator: torch.Generator | None) -> int:
    """The order's seed: the loader's ``generator`` seed, else 0 (as DistributedSampler)."""
    return int(generator.initial_seed()) if generator is not None else 0


def rank_sampler_for(
    dataset: Any,
    *,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
    generator: torch.Generator | None,
) -> tuple[Any, bool | None]:
    """The ``(sampler, shuffle)`` to hand torch's constructor when ``distributed=True``.

    Raises:
        ConfigError: for a dataset or sampler that cannot be split over ranks.
    """
    if batch_sampler is not None:
        raise ConfigError(
            "`distributed=True` cannot split a custom `batch_sampler` over ranks. Build it on "
            "a rank-aware sampler (`stoker.RankSampler` or `DistributedSampler`) and leave "
            "`distributed` False, or pass `batch_size` instead of `batch_sampler`."
        )
    if isinstance(dataset, tud.IterableDataset):
        if getattr(dataset, "splits_by_rank", False) is True:
            return sampler, shuffle  # e.g. ShardStream: it takes its rank's share itself
        raise ConfigError(
            f"`distributed=True` splits map-style datasets by index; "
            f"{type(dataset).__name__} is an IterableDataset, which must split its stream by "
            "rank itself (see `stoker.World.current()`, or `ShardDataset.stream()`, which does). "
            "Use a map-style dataset or leave "
            "`distributed` False."
        )
    if not isinstance(dataset, Sized):
        raise ConfigError(
            f"`distributed=True` needs a dataset with `__len__`; {type(dataset).__name__} has "
            "none. Define `__len__` or pass `sampler=stoker.RankSampler(length, ...)`."
        )
    if sampler is None:
        made = RankSampler(
            dataset, shuffle=bool(shuffle), seed=_seed_of(generator), pad=not drop_last
        )
        return made, None
    if callable(getattr(sampler, "set_epoch", None)):
        return sampler, shuffle  # RankSampler, DistributedSampler or a look-alike
    raise ConfigError(
        f"`distributed=True` with `sampler={type(sampler).__name__}`: that sampler is not "
        "rank-aware, so every rank would load the same samples. Drop `sampler` (stoker splits "
        "the dataset), or pass `stoker.RankSampler` / `DistributedSampler`."
    )


def fingerprint(loader: Any) -> dict[str, Any]:
    """The settings every rank must share, from a loader."""
    dataset = loader.dataset
    sampler = loader.sampler
    seed = getattr(sampler, "seed", None)
    return {
        "dataset length": len(dataset) if isinstance(dataset, Sized) else None,
        "batch_size": loader.batch_size,
        "seed": int(seed) if isinstance(seed, int) else None,
        "drop_last": bool(loader.drop_last),
        "shuffle": getattr(sampler, "shuffle", None),
    }


def check_fingerprints(prints: Sequence[dict[str, Any]]) -> None:
    """Raise if the ranks' fingerprints differ (``prints[r]`` is rank ``r``'s).

    Raises:
        ConfigError: naming each field that differs, with the ranks holding each value.
    """
    lines = []
    for name in FINGERPRINT_FIELDS:
        groups: dict[str, list[int]] = {}
        for rank, fp in enumerate(prints):
            groups.setdefault(repr(fp.get(name)), []).append(rank)
        if len(groups) > 1:
            parts = [
                f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))} = {value}"
                for value, r in groups.items()
            ]
            lines.append(f"  {name}: " + "; ".join(parts))
    if lines:
        raise ConfigError(
            "The ranks' DataLoaders disagree, so they would run different numbers of steps and "
            "hang in a collective:\n"
            + "\n".join(lines)
            + "\nBuild the dataset and the DataLoader identically on every rank (same files, "
            "`batch_size`, `drop_last`, `shuffle`, and `generator` seed)."
        )


def exchange_fingerprints(local: dict[str, Any]) -> None:
    """Gather every rank's fingerprint over the default process group and compare them.

    Does nothing without an initialised process group of two or more ranks.

    Raises:
        ConfigError: if the ranks disagree (raised on every rank).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    check_fingerprints(gathered)


class Coordinator:
    """Per-loader distributed bookkeeping (the loader calls :meth:`begin_epoch`)."""

    def __init__(self) -> None:
        self.checked = False
        self._set_by_us: int | None = None
        self._user_drives = False
        self._noticed = False

    def begin_epoch(self, loader: Any) -> None:
        """Check fingerprints once, then move the sampler to the coming epoch.

        Raises:
            ConfigError: if the ranks' fingerprints differ.
        """
        if not self.checked:
            exchange_fingerprints(fingerprint(loader))
            self.checked = True
        epoch = int(loader._epochs_started)
        sampler = loader.sampler
        if isinstance(sampler, RankSampler):
            sampler.follow_epoch(epoch)
            return
        set_epoch = getattr(sampler, "set_epoch", None)
        if not callable(set_epoch) or self._user_drives:
            return
        current = getattr(sampler, "epoch", None)
        if loader._epoch_request is not None or (
            self._set_by_us is not None and current != self._set_by_us
        ):
            self._user_drives = True  # an explicit set_epoch wins from now on
            return
        if current != epoch and not self._noticed:
            self._noticed = True
            warnings.warn(
                f"stoker: `distributed=True` calls `set_epoch({epoch})` on your "
                f"{type(sampler).__name__} at the start of each epoch, so each epoch gets a new "
                "order. Calling `set_epoch` yourself takes over.",
                UserWarning,
                stacklevel=4,
            )
        set_epoch(epoch)
        self._set_by_us = epoch


def elastic_resume(state: EpochState, loader: Any) -> EpochState:
    """Turn a mid-epoch state saved at another world size into one the sampler can resume.

    The batches delivered before the checkpoint (every rank delivered as many, in lockstep)
    become samples consumed per rank, which the :class:`RankSampler` state records; per-batch
    skipping is cleared, because batch numbers do not carry over to another world size.

    Returns:
        ``state`` itself when nothing needs converting, else the converted state.

    Raises:
        ConfigError: if the delivered batches are not a prefix (``in_order=False``), so the
            samples consumed cannot be known at another world size.
    """
    saved = state.sampler
    if (
        not isinstance(loader.sampler, RankSampler)
        or not isinstance(saved, dict)
        or RankSampler.KEY_WORLD_SIZE not in saved
        or not state.delivered
    ):
        return state
    was, now = int(saved[RankSampler.KEY_WORLD_SIZE]), World.current().world_size
    if loader.sampler.world is not None:
        now = loader.sampler.world.world_size
    if was == now:
        return state
    batches = len(state.delivered)
    if state.delivered != set(range(batches)):
        raise ConfigError(
            f"Cannot resume at world size {now} from a checkpoint taken at world size {was}: "
            f"the batches delivered ({sorted(state.delivered)[:8]}...) have gaps, as "
            "`in_order=False` allows, so the samples consumed on other ranks are unknown. "
            "Resume at the same world size, or checkpoint with `in_order=True`."
        )
    per_batch = loader.batch_size if loader.batch_size is not None else 1
    sampler_state = dict(saved)
    sampler_state[RankSampler.KEY_CONSUMED] = (
        int(saved[RankSampler.KEY_CONSUMED]) + batches * per_batch
    )
    return EpochState(epoch=state.epoch, rng=state.rng, sampler=sampler_state)
