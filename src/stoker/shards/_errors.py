"""Errors raised by the shard reader and writer.

::

    StokerError
    ├── ConfigError
    │   └── ShardArgumentError     (also a ShardError) see below
    └── ShardError                 shards, their index or a pack source are unusable
        ├── CorruptShardError      a shard's bytes differ from its index (names shard + offset)
        ├── IncompleteShardsError  a directory without a complete index (interrupted pack)
        └── ShardArgumentError     a path or option given to pack/index cannot be used as given

``stoker pack`` and ``stoker index`` exit with status 2 on a ``ConfigError`` (the command was
called wrong: the message names the value and the fix) and 1 on any other ``ShardError``.
"""

from __future__ import annotations

from stoker.errors import ConfigError, StokerError

__all__ = ["CorruptShardError", "IncompleteShardsError", "ShardArgumentError", "ShardError"]


class ShardError(StokerError):
    """Shards, their index or a pack source cannot be used; the message names the fix."""


class CorruptShardError(ShardError):
    """A shard is truncated or its bytes differ from the checksums in its index.

    Attributes:
        shard: path of the shard file.
        offset: first byte offset known to be bad (the end of the data for a truncated shard).
    """

    def __init__(self, message: str, *, shard: str, offset: int) -> None:
        super().__init__(message)
        self.shard = shard
        self.offset = offset

    def __reduce__(self) -> tuple[object, ...]:
        # Keep the keyword-only attributes when the error crosses a process boundary.
        return (_rebuild_corrupt, (str(self), self.shard, self.offset))


def _rebuild_corrupt(message: str, shard: str, offset: int) -> CorruptShardError:
    return CorruptShardError(message, shard=shard, offset=offset)


class IncompleteShardsError(ShardError):
    """A shard directory has no complete ``index.json`` (an interrupted or foreign pack)."""


class ShardArgumentError(ShardError, ConfigError):
    """A source, output directory or option cannot be used as given (a missing path, a
    non-empty output, a folder other users may write to); the message names it and the fix."""
