"""Packing into, and indexing, a store prefix (``s3://bucket/prefix``).

A pack to a store writes its shards into a private local staging folder, as a local pack
does, and uploads each one as soon as it is complete (in parts when large), with a small
record of its index entry under ``.stoker-pack/``; ``.stoker-pack.json`` is uploaded first and
``index.json`` last, so a reader never sees a half-written dataset. ``--resume`` reads the
records back to know which shards are already there. ``stoker index s3://...`` downloads each
tar once to describe it, then uploads the index.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stoker.shards._describe import describe_shard
from stoker.shards._errors import ShardArgumentError, ShardError
from stoker.shards._index import (
    INDEX_NAME,
    PACK_STATE_NAME,
    ShardIndex,
    ShardInfo,
    index_bytes,
    shard_name_problem,
)
from stoker.shards._writer import shard_name
from stoker.store import ObjectMismatchError, ObjectMissingError, StoreURL, open_store

__all__ = ["StorePack", "index_store"]

_RECORDS = ".stoker-pack"
_MAX_RECORD_BYTES = 256 * 1024 * 1024
_MAX_STATE_BYTES = 1 << 20


class StorePack:
    """The store side of one pack into ``url``."""

    def __init__(self, url: StoreURL) -> None:
        if not url.writable:
            raise ShardArgumentError(
                f"cannot pack into {url}: {url.scheme}:// is read-only; pack into s3://, gs://, "
                "az:// or a local folder."
            )
        self.url = url
        self.store = open_store(url)

    def prepare(self, state: dict[str, Any], resume: bool) -> list[ShardInfo]:
        """Check the prefix; return the shards already uploaded by an interrupted pack.

        Raises:
            ShardArgumentError: a non-empty prefix without ``resume``, or ``resume`` that does
                not match (or has nothing to resume).
        """
        names = set(self.store.names())
        if not resume:
            if names:
                hint = " or finish it with `--resume`" if PACK_STATE_NAME in names else ""
                raise ShardArgumentError(
                    f"{self.url} is not empty ({sorted(names)[:3]}...): choose an empty "
                    f"prefix{hint}."
                )
            self.store.put(PACK_STATE_NAME, json.dumps(state, sort_keys=True).encode())
            return []
        if PACK_STATE_NAME not in names:
            what = "a complete pack" if INDEX_NAME in names else "no interrupted pack"
            raise ShardArgumentError(f"{self.url} holds {what} to resume: drop `--resume`.")
        found = self._json(PACK_STATE_NAME, _MAX_STATE_BYTES)
        if found != state:
            raise ShardArgumentError(
                f"`--resume` must repeat the interrupted pack's source and options: it packed "
                f"{found}, this call packs {state}."
            )
        return list(self._uploaded(names))

    def _json(self, name: str, limit: int) -> object:
        try:
            return json.loads(self.store.get(name, limit).decode("utf-8"))
        except (ValueError, ObjectMismatchError) as exc:
            raise ShardError(
                f"{self.url.url(name)} is not a record stoker wrote ({exc}): empty the prefix "
                "and pack again without `--resume`."
            ) from None

    def _uploaded(self, names: set[str]) -> Iterator[ShardInfo]:
        number = 0
        while shard_name(number) in names:
            name = shard_name(number)
            try:
                info = ShardInfo.from_json(self._json(f"{_RECORDS}/{name}.json", _MAX_RECORD_BYTES))
            except ObjectMissingError:
                return  # uploaded, but its record was not: upload it again
            if info.name != name or self.store.size(name) != info.size:
                return
            yield info
            number += 1

    def upload(self, info: ShardInfo, local: Path) -> None:
        """Upload a finished shard and its record, then remove the local copy."""
        self.store.put(info.name, local)
        self.store.put(f"{_RECORDS}/{info.name}.json", json.dumps(info.to_json()).encode())
        local.unlink()

    def finish(self, index: ShardIndex) -> None:
        """Upload ``index.json`` (last), then drop the pack's state and records."""
        self.store.put(INDEX_NAME, index_bytes(index))
        for info in index.shards:
            self.store.delete(f"{_RECORDS}/{info.name}.json")
        self.store.delete(PACK_STATE_NAME)

    def abandon(self) -> None:
        """Remove the state of a pack that uploaded no shard, so the prefix is empty again."""
        self.store.delete(PACK_STATE_NAME)


def index_store(url: StoreURL) -> ShardIndex:
    """Index the ``.tar`` objects directly under ``url`` and upload ``index.json``.

    Raises:
        ShardArgumentError: no ``.tar`` objects there, or the store is read-only.
        ShardError: a tar cannot be indexed.
    """
    pack = StorePack(url)
    names = sorted(n for n in pack.store.names() if n.endswith(".tar"))
    names = [n for n in names if shard_name_problem(n) is None]
    if not names:
        raise ShardArgumentError(
            f"{url} has no `.tar` objects to index; write shards with `stoker pack SRC {url}`."
        )
    infos = []
    with tempfile.TemporaryDirectory(prefix="stoker-index-") as staging:
        for name in names:
            local = Path(staging) / name
            size = pack.store.size(name)
            with open(local, "w+b") as out:
                pack.store.download(name, out, size)
            infos.append(describe_shard(local))
            local.unlink()
    index = ShardIndex(tuple(infos), {})
    pack.store.put(INDEX_NAME, index_bytes(index))
    return index
