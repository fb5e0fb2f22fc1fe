"""Moving batches from workers to the main process through reused shared memory.

Lifecycle of one slot::

    worker: SlotArena.begin() picks a FREE slot (or creates one) -> collate/encode writes
            tensors into it -> state byte set to BUSY -> a small header crosses the pipe
    main:   SlotMap.open(name) maps it once -> decode() builds zero-copy views over it and
            ties a finalizer to the views' common owner
    main:   the user drops the last view -> finalizer sets the state byte back to FREE
    worker: the slot is reused for a later batch (no new segment, no page faults)

A worker learns the slot size from its first batch (collated into ordinary memory, then copied
into a slot 25% larger: GROWTH_FACTOR), or from the size it was told at start
(``SlotArena(expect=...)``: the head start's batch), in which case it makes the slot before
its first task and that batch collates straight into it.

A slot is a file in its pool's private directory (:class:`PoolNamespace`: mode 0700, a random
name, locked with ``flock`` for the pool's life). The pool removes the directory at shutdown;
a later run removes directories of this user whose lock no live process holds.
"""

from stoker.transport._codec import decode, encode
from stoker.transport._namespace import (
    MARKER,
    PoolNamespace,
    ReclaimReport,
    create_private_file,
    open_private_file,
    reclaim_stale_pools,
)
from stoker.transport._slots import (
    GROWTH_FACTOR,
    SlotArena,
    SlotMap,
    slot_prefix,
    unlink_owned,
    warn_no_room,
)

__all__ = [
    "GROWTH_FACTOR",
    "MARKER",
    "PoolNamespace",
    "ReclaimReport",
    "SlotArena",
    "SlotMap",
    "create_private_file",
    "decode",
    "encode",
    "open_private_file",
    "reclaim_stale_pools",
    "slot_prefix",
    "unlink_owned",
    "warn_no_room",
]
