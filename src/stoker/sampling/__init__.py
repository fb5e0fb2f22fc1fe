"""Rank-aware sampling for distributed data-parallel training, and what an epoch's order implies.

``_samplers`` holds :class:`RankSampler` and :class:`World`; ``_partition`` splits a global
order over ranks (pure functions); ``_seeding`` derives per-batch seeds from the order; ``_resume``
is the exact mid-epoch resume state, a function of the sampler and never of the workers.
"""

from stoker.sampling._samplers import (
    Layout,
    RankSampler,
    World,
    partition,
    rank_positions,
    shard_order,
)

__all__ = ["Layout", "RankSampler", "World", "partition", "rank_positions", "shard_order"]
