"""The ``remote`` workload's contenders: how each library's data gets into the bucket, and how
each reads it back as a shuffled stream of batches.

Every contender reads the same samples (the ``shards`` workload's JPEGs and labels) and does
the same work per sample (:func:`stoker.bench._shards.augment`), with the same batch size and
worker count; each uses its own format and its own download cache:

- ``stoker``: the packed tar shards and ``index.json``, read by ``ShardDataset(url,
  cache_dir=...).stream()`` in stoker's DataLoader;
- ``webdataset``: the same tar shards over HTTP (``curl``, presigned URLs), with WebDataset's
  shard cache, in torch's DataLoader;
- ``litdata``: LitData's own chunks (``litdata.optimize``), ``StreamingDataset`` in its
  ``StreamingDataLoader``.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.utils.data as tud

from stoker.bench._shards import augment

__all__ = ["BUCKET", "MISSING", "PEERS", "Peer", "Source"]

BUCKET = "stoker-bench-remote"
# A library that cannot be compared here, and why (the table's notes say it).
MISSING: dict[str, str] = {
    "mosaicml-streaming": "not compared: mosaicml-streaming 0.13 pins numpy<2.2 and imports "
    "torchvision on import, which has no build for the CPU torch 2.13 the bench runs beside",
}
# Seconds a worker may wait for one batch before the contender fails.
BATCH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Source:
    """Where the samples are.

    Attributes:
        shards: the local shard folder (``ensure_shards``).
        images: the JPEG files, in sample order (``ensure_images``).
        endpoint_url: the S3 endpoint (the bench's proxy).
        client: a boto3 client straight to the server, for uploads.
    """

    shards: Path
    images: tuple[str, ...]
    endpoint_url: str
    client: Any


@dataclass(frozen=True)
class Open:
    """What a contender's run needs: where its cache is, how to batch, how many workers."""

    cache: Path
    batch_size: int
    workers: int
    seed: int
    shuffle_buffer: int
    multiprocessing_context: str | None


@dataclass(frozen=True)
class Peer:
    """A contender: the module it needs, how its data is put in the bucket, how it reads.

    ``upload(source)`` is called once per bench (it may cache a conversion in the bench's
    cache folder); ``open(source, how)`` returns the loader over one epoch.
    """

    name: str
    module: str
    upload: Callable[[Source], None]
    open: Callable[[Source, Open], Iterable[Any]]

    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


def upload_folder(client: Any, folder: Path, prefix: str) -> None:
    """Upload every file of ``folder`` under ``s3://BUCKET/prefix/`` (``index.json`` last)."""
    files = sorted((p for p in folder.iterdir() if p.is_file()), key=lambda p: p.suffix == ".json")
    for path in files:
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")


# -- stoker -----------------------------------------------------------------------------------


def _stoker_upload(source: Source) -> None:
    upload_folder(source.client, source.shards, "stoker")


def _stoker_open(source: Source, how: Open) -> Iterable[Any]:
    from stoker.loader._loader import DataLoader
    from stoker.shards import ShardDataset

    dataset = ShardDataset(f"s3://{BUCKET}/stoker", decode=augment, cache_dir=how.cache)
    stream = dataset.stream(shuffle=True, buffer_size=how.shuffle_buffer, seed=how.seed)
    return DataLoader(
        stream,
        batch_size=how.batch_size,
        num_workers=how.workers,
        multiprocessing_context=how.multiprocessing_context if how.workers else None,
        timeout=BATCH_TIMEOUT_S if how.workers else 0,
    )


# -- WebDataset -------------------------------------------------------------------------------

PRESIGNED_S = 3600  # seconds a shard's URL stays valid, far beyond an epoch


def _webdataset_open(source: Source, how: Open) -> Iterable[Any]:
    import boto3  # lazy, as every peer's library: imported only when that peer runs
    import webdataset as wds

    # Presigned URLs, as for any private bucket read over plain HTTP (the cache names files
    # by the URL's path, so a warm run's fresh signatures still hit it).
    signer = boto3.client("s3", endpoint_url=source.endpoint_url)
    try:
        urls = [
            signer.generate_presigned_url(
                "get_object",
                Params={"Bucket": BUCKET, "Key": f"stoker/{p.name}"},
                ExpiresIn=PRESIGNED_S,
            )
            for p in sorted(source.shards.glob("*.tar"))
        ]
    finally:
        signer.close()
    dataset = (
        wds.WebDataset(
            urls,
            shardshuffle=len(urls),
            cache_dir=str(how.cache),
            workersplitter=wds.split_by_worker,
            nodesplitter=wds.single_node_only,
            seed=how.seed,
            empty_check=False,  # a worker dealt no shard (fewer shards than workers) yields none
        )
        .shuffle(how.shuffle_buffer)
        .map(augment)
    )
    return tud.DataLoader(
        dataset,
        batch_size=how.batch_size,
        num_workers=how.workers,
        multiprocessing_context=how.multiprocessing_context if how.workers else None,
        timeout=BATCH_TIMEOUT_S if how.workers else 0,
    )


# -- LitData ----------------------------------------------------------------------------------

LITDATA_DIR = "jpeg-v1-litdata-{count}"
LITDATA_CHUNK_BYTES = 32 * 1000 * 1000  # as the stoker shards' size


def _read_jpeg(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        data = f.read()
    index = int(Path(path).stem)
    return {"jpg": data, "cls": str(index % 1000).encode()}


def _litdata_complete(out: Path) -> bool:
    """Whether ``out`` holds an index and every chunk it names (an earlier optimize ended)."""
    try:
        chunks = json.loads((out / "index.json").read_text())["chunks"]
        return bool(chunks) and all((out / c["filename"]).is_file() for c in chunks)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _litdata_upload(source: Source) -> None:
    from litdata import optimize

    from stoker.bench._workloads import cache_dir

    out = cache_dir() / LITDATA_DIR.format(count=len(source.images))
    if not _litdata_complete(out):
        method = multiprocessing.get_start_method(allow_none=True)
        try:
            optimize(
                fn=_read_jpeg,
                inputs=list(source.images),
                output_dir=str(out),
                chunk_bytes=LITDATA_CHUNK_BYTES,
                num_workers=min(2, os.cpu_count() or 1),
                mode="overwrite",
            )
        finally:  # optimize() sets the process-wide start method to spawn for every loader
            multiprocessing.set_start_method(method, force=True)
    upload_folder(source.client, out, "litdata")


def _allow_http_in_litdata() -> None:
    """Let LitData's obstore client speak plain HTTP to the bench's local server.

    LitData builds its obstore ``S3Store`` with client options of its own, which carry no
    ``allow_http`` and ignore ``AWS_ALLOW_HTTP``, and offers no setting for it; a real store
    is HTTPS and needs none. Workers forked after this inherit it.
    """
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"


def _litdata_open(source: Source, how: Open) -> Iterable[Any]:
    from litdata import StreamingDataLoader, StreamingDataset

    _allow_http_in_litdata()
    dataset = StreamingDataset(
        input_dir=f"s3://{BUCKET}/litdata",
        cache_dir=str(how.cache),
        shuffle=True,
        seed=how.seed,
        transform=augment,
    )
    loader: Iterable[Any] = StreamingDataLoader(
        dataset, batch_size=how.batch_size, num_workers=how.workers
    )
    return loader


PEERS: tuple[Peer, ...] = (
    Peer("stoker", "stoker.store", _stoker_upload, _stoker_open),
    Peer("webdataset", "webdataset", _stoker_upload, _webdataset_open),
    Peer("litdata", "litdata", _litdata_upload, _litdata_open),
)
