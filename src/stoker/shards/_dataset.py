"""ShardDataset: map-style random access to indexed tar shards through mmap."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.utils.data as tud

from stoker.errors import ConfigError
from stoker.shards._decode import Decode, make_decoder, select_fields
from stoker.shards._index import ShardIndex, read_index
from stoker.shards._limits import MAX_IMAGE_PIXELS
from stoker.shards._reader import ShardReader, Verify
from stoker.shards._remote import RemoteShards
from stoker.shards._stream import ShardStream
from stoker.store import ShardCache, StoreURL, parse_url

if TYPE_CHECKING:
    from stoker.sampling import World

__all__ = ["ShardDataset"]


class ShardDataset(tud.Dataset[Any]):
    """Random access to the samples of a shard directory (``stoker pack`` or ``stoker index``).

    Sample ``i`` is found through the index and read from a memory map of its shard. By default
    each field is a ``bytes`` copy, so that samples pickle out of workers and torch's default
    collate batches them as lists (``DataLoader(ShardDataset(path), batch_size=4)`` works);
    :meth:`raw` gives the zero-copy ``memoryview`` fields instead, and decoders receive those.
    Shards are opened lazily in each process and never shared across a fork; the dataset pickles
    without its maps, so it works with fork and spawn workers.

    A sample is a dict ``{"__key__": key, "__shard__": shard name, ext: value, ...}``, or a
    tuple when ``fields`` is given.

    From a URL (``s3://bucket/prefix``, ``gs://``, ``az://``, ``http(s)://``; see
    docs/streaming.md) the index is fetched at once and each shard is downloaded whole into a
    local cache on first use (by every process that reads it, once per machine); a stream
    prefetches the shards it will read next.

    Args:
        path: the shard directory, or a store URL (``file://`` is a local path).
        decode: ``"bytes"`` (default; ``None`` means the same: each field copied out as
            ``bytes``, not decoded), ``"pil"``, ``"numpy"`` or ``"torch"`` (decode every
            known field, images into that type), a mapping from extension to a callable taking
            the bytes, or a callable taking the raw sample (zero-copy ``memoryview`` fields).
        fields: return a tuple of these fields, in order (``"jpg;png"`` takes whichever is
            present). Default ``None``: the whole dict.
        transform: applied last to each sample. Default ``None``.
        verify: ``"lazy"`` (default: hash each shard on first touch in each process),
            ``"full"`` (hash every shard now) or ``"off"``.
        max_image_pixels: with ``decode``, a sample whose images declare more pixels in all
            is refused before they are decoded, with a ``ShardError``. Default 89,478,485,
            Pillow's own threshold for one image (Pillow's process-wide setting is neither
            read nor changed); ``None`` for no limit.
        cache_dir: with a URL, the local cache folder (created 0700). Default ``None``:
            ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``.
        cache_limit: with a URL, the cache's budget in bytes or as ``"20GB"``; least recently
            used shards are evicted, never one a process has mapped. Default ``None``: none.

    Raises:
        IncompleteShardsError: if the directory has no complete index; the message names
            `stoker pack --resume` or `stoker index`.
        ShardError: if the index is invalid.
        CorruptShardError: with ``verify="full"``, if a shard is missing, truncated or altered.
        StoreError: the store failed after retries (naming the URL, status and attempts).
        StoreURLError: an unknown URL scheme, or ``cache_*`` given with a local path.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        decode: Decode = "bytes",
        fields: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        verify: Verify = "lazy",
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        where = parse_url(path)
        self.remote: RemoteShards | None = None
        if isinstance(where, StoreURL):
            self.remote = RemoteShards(where, ShardCache(cache_dir, cache_limit))
            self.path: Path | str = str(where)
            self.index: ShardIndex = self.remote.index
            directory = self.remote.cache.directory / "objects"
        else:
            if cache_dir is not None or cache_limit is not None:
                raise ConfigError(
                    "`cache_dir` and `cache_limit` apply to a store URL (s3://...); "
                    f"{str(where)!r} is a local folder: drop them."
                )
            self.path = directory = where
            self.index = read_index(where)
        self._decode_arg = decode
        # A memoryview field would not pickle out of a worker, and torch's default collate takes
        # it for a sequence of ints (one tensor per byte position, or an "equal size" error).
        self._decode = make_decoder(
            "bytes" if decode is None else decode, max_image_pixels=max_image_pixels
        )
        self._fields = tuple(fields) if fields is not None else None
        self._transform = transform
        counts = np.array([s.samples for s in self.index.shards], dtype=np.int64)
        self._starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self._starts[1:])
        self._reader = ShardReader(directory, self.index, verify, self.remote)

    # -- structure, for samplers that prefer whole shards ---------------------------------

    @property
    def shard_names(self) -> tuple[str, ...]:
        """File names of the shards, in index order."""
        return tuple(s.name for s in self.index.shards)

    @property
    def shard_sizes(self) -> tuple[int, ...]:
        """Number of samples in each shard."""
        return tuple(s.samples for s in self.index.shards)

    def shard_range(self, shard: int) -> range:
        """Global sample indices held by shard number ``shard``."""
        return range(int(self._starts[shard]), int(self._starts[shard + 1]))

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, index within the shard)`` of sample ``index``.

        Raises:
            IndexError: if ``index`` is out of range.
        """
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample index {index} out of range for {n} samples in {self.path}")
        index %= n
        shard = int(np.searchsorted(self._starts, index, side="right")) - 1
        return shard, index - int(self._starts[shard])

    @property
    def meta(self) -> dict[str, Any]:
        """Metadata the packer stored (e.g. ``classes`` for an image folder)."""
        return dict(self.index.meta)

    # -- access ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._starts[-1])

    def raw(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as zero-copy ``memoryview`` fields into the shard's memory map, not
        decoded. Views do not pickle: copy them before they leave a worker.

        Raises:
            IndexError: if ``index`` is out of range.
            CorruptShardError: if its shard is missing, truncated or fails verification.
        """
        return self._sample(index, copy=False)

    def _sample(self, index: int, *, copy: bool) -> dict[str, Any]:
        shard, local = self.locate(index)
        info = self.index.shards[shard]
        if self.remote is not None:
            self.remote.reading(shard)
        view = self._reader.view(shard)
        sample: dict[str, Any] = {"__key__": info.keys[local], "__shard__": info.name}
        for ext, offset, size in info.members(local):
            sample[ext] = (
                bytes(view[offset : offset + size]) if copy else view[offset : offset + size]
            )
        return sample

    def buffered(self, index: int) -> dict[str, Any]:
        """Sample ``index`` for a stream's shuffle buffer: views for a local dataset, copies
        for a remote one (a held view would keep its shard pinned in a bounded cache)."""
        return self._sample(index, copy=self.remote is not None)

    def plan(self, shards: list[int]) -> None:
        """Tell a remote dataset which shards this process reads next (a no-op locally)."""
        if self.remote is not None:
            self.remote.plan(shards)

    def start_early(self, shards: list[int]) -> None:
        """Start downloading an epoch's first shards in this process, before any worker reads
        (a remote dataset whose cache has no budget; a no-op otherwise: with a budget the
        workers' own prefetch, which stays within it, does this)."""
        if self.remote is not None and self.remote.cache.limit is None:
            self.remote.plan(shards)

    def __getitem__(self, index: int) -> Any:
        return self.finish(self.raw(index))

    def finish(self, sample: dict[str, Any]) -> Any:
        """Apply ``decode``, ``fields`` and ``transform`` to a raw sample."""
        out: Any = sample
        if self._decode is not None:
            out = self._decode(out)
        if self._fields is not None:
            out = select_fields(out, self._fields, str(self.path))
        if self._transform is not None:
            out = self._transform(out)
        return out

    def stream(
        self,
        *,
        shuffle: bool = True,
        buffer_size: int = 1000,
        seed: int = 0,
        world: World | None = None,
        pad: bool = True,
    ) -> ShardStream:
        """An iterable view that reads shards sequentially (see :class:`ShardStream`).

        Args:
            shuffle: shuffle the shard order each epoch and samples through a buffer.
                Default ``True``.
            buffer_size: samples held by the shuffle buffer. Default 1000. It yields once
                it holds 100 (or ``buffer_size``) and fills up as it yields, two samples read
                for each yielded, so the first batch need not wait for a full buffer.
            seed: base seed, the same on every rank; the order depends on ``(seed, epoch,
                rank, worker)``. Default 0.
            world: the ranks to split over. Default ``None``: :meth:`stoker.World.current`
                when iterating (the process group, else torchrun's environment, else one
                rank). Pass ``stoker.World()`` to read everything on every rank.
            pad: in a distributed job, ``True`` (default) repeats up to ``world_size - 1``
                samples per epoch so every rank gets the same count; ``False`` skips up to
                ``world_size - 1`` instead.
        """
        return ShardStream(
            self, shuffle=shuffle, buffer_size=buffer_size, seed=seed, world=world, pad=pad
        )

    def close(self) -> None:
        """Unmap this process's shards and stop its prefetch; both restart on the next access."""
        self._reader.close()
        if self.remote is not None:
            self.remote.close()

    def __repr__(self) -> str:
        return (
            f"ShardDataset({str(self.path)!r}, samples={len(self)}, "
            f"shards={len(self.index.shards)}, "
            f"decode={self._decode_arg!r}, verify={self._reader.verify!r})"
        )
