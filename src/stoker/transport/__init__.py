"""Moving batches from workers to the main process through reused shared memory.

Lifecycle of one slot::

    worker: SlotArena.begin() picks a FREE slot (or creates one) -> collate/encode writes
            tensors into it -> state byte set to BUSY -> a small header crosses the pipe
    main:   SlotMap.open(name) maps it once -> decode() builds zero-copy views over it and
            ties a finalizer to the views' common owner
    main:   the user drops the last view -> finalizer sets the state byte back to FREE
    worker: the slot is reused for a later batch (no new segment, no page faults)

A slot is a file in the shared-memory directory named ``stoker-<owner pid>-...``; the owner
(main process) unlinks every file with its prefix at shutdown, and a later run unlinks those
of owners that are no longer alive.
"""

from stoker.transport._codec import decode, encode
from stoker.transport._slots import (
    SlotArena,
    SlotMap,
    reclaim_stale_segments,
    slot_prefix,
    unlink_owned,
)

__all__ = [
    "SlotArena",
    "SlotMap",
    "decode",
    "encode",
    "reclaim_stale_segments",
    "slot_prefix",
    "unlink_owned",
]
