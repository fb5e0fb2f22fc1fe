"""Indexed tar shards (WebDataset-compatible), and LMDB/HDF5 files, as datasets.

Lifecycle::

    source (image folder | files by stem | LMDB | HDF5 | module:factory)
      -> pack(): workers encode samples, one ShardWriter appends them in order
           .stoker-pack.json (first) -> shard-000000.tar ... (each temp+fsync+rename)
           -> index.json (last)
      -> ShardDataset(dir): index -> per-process mmap -> memoryview fields -> decode (bytes)
           .stream(): shard-shuffled sequential iteration with a shuffle buffer

Modules: ``_tar`` member bytes and offsets, ``_index`` index.json, ``_writer`` ShardWriter,
``_sources`` pack sources, ``_encode``/``_decode`` field conventions, ``_pack`` pack(),
``_reader`` mmap + verification, ``_dataset`` ShardDataset, ``_stream`` ShardStream, ``_kv``
LMDB and HDF5 datasets, ``_pack_cli``/``_index_cli`` the ``stoker pack``/``stoker index`` commands,
``_remote`` a dataset in object storage read through :mod:`stoker.store`'s cache, ``_upload``
pack and index into a store prefix (docs/streaming.md).
"""

from __future__ import annotations

from stoker.shards._dataset import ShardDataset
from stoker.shards._decode import Decode, ImageMode, decode_field, decode_sample, make_decoder
from stoker.shards._describe import build_index
from stoker.shards._encode import encode_value
from stoker.shards._errors import CorruptShardError, IncompleteShardsError, ShardError
from stoker.shards._index import ShardIndex, ShardInfo, read_index
from stoker.shards._kv import HDF5Dataset, LMDBDataset
from stoker.shards._pack import pack
from stoker.shards._reader import Verify
from stoker.shards._sources import Source, SourceFormat, open_source
from stoker.shards._stream import ShardStream
from stoker.shards._writer import ShardWriter

__all__ = [
    "CorruptShardError",
    "Decode",
    "HDF5Dataset",
    "ImageMode",
    "IncompleteShardsError",
    "LMDBDataset",
    "ShardDataset",
    "ShardError",
    "ShardIndex",
    "ShardInfo",
    "ShardStream",
    "ShardWriter",
    "Source",
    "SourceFormat",
    "Verify",
    "build_index",
    "decode_field",
    "decode_sample",
    "encode_value",
    "make_decoder",
    "open_source",
    "pack",
    "read_index",
]
