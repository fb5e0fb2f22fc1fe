"""The ranks of a distributed job, as torch.distributed or torchrun's environment describe them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from stoker.errors import ConfigError

__all__ = ["WORLD_SIZE_LIMIT", "World", "WorldSource"]

WorldSource = Literal["process_group", "environment", "single"]

# World sizes a saved state may name: beyond the largest jobs (resuming loops over the ranks).
WORLD_SIZE_LIMIT = 1 << 17


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"The environment variable `{name}` must be an integer. Found: {raw!r}. "
            "Launch with torchrun, or unset it."
        ) from None


@dataclass(frozen=True)
class World:
    """Where this process stands among the ranks of a distributed job.

    Args:
        rank: this process's rank, ``0 <= rank < world_size``. Default 0.
        world_size: number of ranks. Default 1.
        local_rank: rank on this node (the GPU it should use). Default 0.
        source: where the values came from: ``"process_group"``, ``"environment"`` (torchrun's
            variables) or ``"single"``.

    Raises:
        ConfigError: if a value is out of range.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    source: WorldSource = "single"

    def __post_init__(self) -> None:
        for name in ("rank", "world_size", "local_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"`{name}` must be an int. Found: {value!r}.")
        if self.world_size < 1:
            raise ConfigError(f"`world_size` must be >= 1. Found: {self.world_size}.")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"`rank` must be in [0, {self.world_size}) for `world_size={self.world_size}`. "
                f"Found: {self.rank}."
            )
        if self.local_rank < 0:
            raise ConfigError(f"`local_rank` must be >= 0. Found: {self.local_rank}.")

    @property
    def distributed(self) -> bool:
        """True when there is more than one rank."""
        return self.world_size > 1

    @classmethod
    def current(cls) -> World:
        """The world of this process.

        From the initialised ``torch.distributed`` process group when there is one; else from
        torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); else a single rank.
        ``LOCAL_RANK`` defaults to 0 when it is not set.

        Raises:
            ConfigError: if torchrun's variables are malformed or inconsistent.
        """
        local = _env_int("LOCAL_RANK")
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return cls(
                    dist.get_rank(), dist.get_world_size(), local or 0, source="process_group"
                )
        except ImportError:  # pragma: no cover - torch always ships torch.distributed
            pass
        rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
        if rank is not None and size is not None:
            if not 0 <= rank < size:
                raise ConfigError(
                    f"torchrun's environment says `RANK={rank}` but `WORLD_SIZE={size}`; the "
                    "rank must be below the world size. Launch with torchrun, or unset both."
                )
            return cls(rank, size, local or 0, source="environment")
        return cls()
