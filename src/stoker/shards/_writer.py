"""ShardWriter: appends encoded samples to size-bounded tar shards, atomically.

Each shard is written to a new hidden temporary file of an unpredictable name (``mkstemp``: a
link planted in the directory is never written through), closed with the end-of-archive
blocks, fsync'ed, read back (every member's offset and name is checked against what was
written) and renamed to ``shard-NNNNNN.tar``; the directory is fsync'ed after each rename. A
shard therefore exists under its final name only when complete. The boundaries depend only on
the sample sizes and ``shard_size``, so a pack resumed after the last complete shard writes the
same bytes as one that never stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from stoker.errors import ConfigError
from stoker.shards._describe import describe_shard
from stoker.shards._errors import ShardError
from stoker.shards._files import check_output_dir, publish
from stoker.shards._index import ShardInfo
from stoker.shards._tar import EncodedSample, check_member_name, end_of_archive

__all__ = ["SHARD_PREFIX", "ShardWriter", "shard_name"]

SHARD_PREFIX = "shard-"


def shard_name(number: int) -> str:
    """File name of shard ``number``: ``shard-000042.tar``."""
    return f"{SHARD_PREFIX}{number:06d}.tar"


class ShardWriter:
    """Writes samples into numbered tar shards of at most ``shard_size`` bytes each.

    A shard holds at least one sample; a sample larger than ``shard_size`` gets a shard of its
    own.

    Args:
        directory: where the shards go (must exist).
        shard_size: upper bound in bytes of each shard, end-of-archive blocks included.
        first_shard: number of the first shard to write. Default 0 (``--resume`` passes the
            number of shards already complete).
        on_shard: called with each completed shard's :class:`ShardInfo`. Default ``None``.

    Raises:
        ConfigError: if ``shard_size`` is below 10 KiB (one tar record plus a member).
        ShardArgumentError: if other users may write to ``directory`` (see
            :func:`stoker.shards._files.check_output_dir`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        shard_size: int,
        first_shard: int = 0,
        on_shard: Callable[[ShardInfo], None] | None = None,
    ) -> None:
        if not isinstance(shard_size, int) or shard_size < 10 * 1024:
            raise ConfigError(f"`shard_size` must be an int >= 10240 bytes. Found: {shard_size!r}.")
        self.directory = Path(directory)
        check_output_dir(self.directory)
        self.shard_size = shard_size
        self.shards: list[ShardInfo] = []
        self._number = first_shard
        self._on_shard = on_shard
        self._file: BinaryIO | None = None
        self._tmp: Path | None = None
        self._offset = 0
        self._expected: list[tuple[str, int, int]] = []

    def _trailer_size(self, offset: int) -> int:
        return len(end_of_archive(offset))

    def write(self, sample: EncodedSample) -> None:
        """Append one sample, starting a new shard first when it would not fit.

        Args:
            sample: from :func:`stoker.shards._tar.encode_sample`.

        Raises:
            ShardError: if a member name is absolute, has a ``..`` component or a NUL.
        """
        for ext, _, _ in sample.members:
            check_member_name(f"{sample.key}.{ext}")
        end = self._offset + len(sample.blob)
        if (
            self._file is not None
            and self._expected
            and end + self._trailer_size(end) > self.shard_size
        ):
            self._finish()
        if self._file is None:
            fd, tmp = tempfile.mkstemp(
                dir=self.directory, prefix=f".{shard_name(self._number)}.", suffix=".tmp"
            )
            self._tmp = Path(tmp)
            self._file = open(fd, "wb")
            self._offset = 0
            self._expected = []
        self._file.write(sample.blob)
        for ext, rel, size in sample.members:
            self._expected.append((f"{sample.key}.{ext}", self._offset + rel, size))
        self._offset += len(sample.blob)

    def _finish(self) -> None:
        assert self._file is not None and self._tmp is not None  # internal invariant
        self._file.write(end_of_archive(self._offset))
        self._file.flush()
        info = describe_shard(self._tmp)
        found = [
            (f"{key}.{ext}", off, size)
            for i, key in enumerate(info.keys)
            for ext, off, size in info.members(i)
        ]
        if found != self._expected:
            raise ShardError(
                f"{self._tmp}: reading the shard back gave different member offsets than were "
                "written; this is a bug in stoker, please report it."
            )
        final = self.directory / shard_name(self._number)
        publish(self._file, self._tmp, final)
        self._file = None
        info = dataclasses.replace(info, name=final.name)
        self.shards.append(info)
        self._number += 1
        if self._on_shard is not None:
            self._on_shard(info)

    def close(self) -> list[ShardInfo]:
        """Finish the current shard, if any samples are pending.

        Returns:
            Every shard this writer completed, in order.
        """
        if self._file is not None and self._expected:
            self._finish()
        return self.shards

    def abort(self) -> None:
        """Drop the shard in progress (its temporary file is removed)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                self._tmp.unlink()
