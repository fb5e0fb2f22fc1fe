"""Packing to and reading from a real S3-API server (moto's, on loopback), through the cache."""

from __future__ import annotations

import collections
import fcntl
import json
import os
import time
from pathlib import Path

import pytest
import torch
from store_helpers import S3, SAMPLES, SHARD_SIZE

import stoker
from stoker.shards import IncompleteShardsError, ShardDataset, ShardError, _stream, pack
from stoker.shards._index import read_index
from stoker.store import ShardCache, StoreURLError


def _cache_bytes(cache: Path) -> int:
    """The cache's bytes at one instant: listed under the cache's lock, which every
    reservation and eviction takes (listed without it, a shard evicted after it was counted
    and the download that took its room summed to one shard over the budget, in CI)."""
    lock = cache / "cache.lock"
    if not lock.exists():
        return 0
    sizes = {}
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for p in cache.rglob("*"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            if p.is_file():  # by inode: a download renamed meanwhile is one file
                sizes[st.st_ino] = st.st_size
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return sum(sizes.values())


def test_pack_to_the_store_reads_back_byte_identical(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    pack(samples_dir, local, shard_size=SHARD_SIZE)
    index = pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    client = s3_server.client()
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {f"ds/{s.name}" for s in index.shards} | {"ds/index.json"}  # no leftovers
    for shard in index.shards:
        got = client.get_object(Bucket=bucket, Key=f"ds/{shard.name}")["Body"].read()
        assert got == (local / shard.name).read_bytes()
    remote_index = client.get_object(Bucket=bucket, Key="ds/index.json")["Body"].read()
    assert remote_index == (local / "index.json").read_bytes()
    ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
    here = ShardDataset(local)
    assert len(ds) == len(here) == SAMPLES
    assert all(ds[i] == here[i] for i in range(len(ds)))
    assert oct((tmp_path / "cache").stat().st_mode & 0o777) == "0o700"


def test_an_epoch_with_two_process_workers_yields_every_sample_once(
    bucket: str, samples_dir: Path, tmp_path: Path
) -> None:
    pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
    for data in (ds.stream(buffer_size=8), ds):
        seen: collections.Counter[str] = collections.Counter()
        loader = stoker.DataLoader(data, batch_size=8, num_workers=2)
        for batch in loader:
            seen.update(batch["__key__"])
        assert len(seen) == SAMPLES and set(seen.values()) == {1}


def test_a_cache_smaller_than_the_dataset_stays_within_budget(
    bucket: str, samples_dir: Path, tmp_path: Path
) -> None:
    index = pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    largest = max(s.size for s in index.shards)
    total = sum(s.size for s in index.shards)
    # Two workers map at most two shards each (reader.MAX_REMOTE_MAPS); prefetch uses the rest.
    limit = 4 * largest
    assert limit < total / 2
    cache = tmp_path / "cache"
    ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=cache, cache_limit=limit)
    seen: collections.Counter[str] = collections.Counter()
    loader = stoker.DataLoader(ds.stream(buffer_size=4), batch_size=4, num_workers=2)
    for batch in loader:
        seen.update(batch["__key__"])
        assert _cache_bytes(cache) <= limit
    assert len(seen) == SAMPLES and set(seen.values()) == {1}


def test_two_loaders_sharing_a_cache_download_each_shard_once(
    s3_server: S3, samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _proxy import FaultProxy
    from store_helpers import point_at

    name = "shared-cache"
    s3_server.client().create_bucket(Bucket=name)
    point_at(monkeypatch, s3_server.port)
    index = pack(samples_dir, f"s3://{name}/ds", shard_size=SHARD_SIZE)
    with FaultProxy(s3_server.port) as proxy:
        point_at(monkeypatch, proxy.port)
        cache = tmp_path / "cache"
        a = ShardDataset(f"s3://{name}/ds", cache_dir=cache)
        b = ShardDataset(f"s3://{name}/ds", cache_dir=cache)
        loaders = [stoker.DataLoader(d.stream(), batch_size=8, num_workers=2) for d in (a, b)]
        counts = [0, 0]
        for x, y in zip(*loaders, strict=True):
            counts[0] += len(x["__key__"])
            counts[1] += len(y["__key__"])
        assert counts == [SAMPLES, SAMPLES]
        assert [proxy.gets(f"ds/{s.name}") for s in index.shards] == [1] * len(index.shards)


def test_a_loader_resumes_mid_epoch_from_a_remote_dataset(
    bucket: str, samples_dir: Path, tmp_path: Path
) -> None:
    pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)

    def loader() -> stoker.DataLoader:
        ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
        generator = torch.Generator().manual_seed(7)
        return stoker.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, generator=generator)

    first = loader()
    it = iter(first)
    head = [k for _ in range(5) for k in next(it)["__key__"]]
    state = first.state_dict()
    rest_expected = [k for b in it for k in b["__key__"]]
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [k for b in resumed for k in b["__key__"]]
    assert rest == rest_expected
    index = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache").index
    assert sorted(head + rest) == sorted(k for s in index.shards for k in s.keys)


def test_pack_resumes_against_the_store(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path
) -> None:
    from stoker.shards._sources import open_source

    good = open_source(samples_dir)

    class Breaks:
        description, meta = good.description, good.meta

        def __len__(self) -> int:
            return len(good)

        def sample(self, index: int):  # type: ignore[no-untyped-def]
            if index == 30:
                raise OSError("disk went away")
            return good.sample(index)

    url = f"s3://{bucket}/ds"
    with pytest.raises(OSError, match="disk went away"):
        pack(Breaks(), url, shard_size=SHARD_SIZE)
    with pytest.raises(IncompleteShardsError, match="--resume"):
        ShardDataset(url, cache_dir=tmp_path / "cache")
    with pytest.raises(ShardError, match="not empty"):
        pack(good, url, shard_size=SHARD_SIZE)
    index = pack(good, url, shard_size=SHARD_SIZE, resume=True)
    local = tmp_path / "local"
    pack(good, local, shard_size=SHARD_SIZE)
    body = s3_server.client().get_object(Bucket=bucket, Key="ds/index.json")["Body"].read()
    assert body == (local / "index.json").read_bytes()
    assert index.samples == SAMPLES


def test_index_of_a_store_prefix(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    index = pack(samples_dir, local, shard_size=SHARD_SIZE)
    client = s3_server.client()
    for shard in index.shards:
        client.put_object(
            Bucket=bucket, Key=f"w/{shard.name}", Body=(local / shard.name).read_bytes()
        )
    from stoker.cli import main

    assert main(["index", f"s3://{bucket}/w"]) == 0
    body = client.get_object(Bucket=bucket, Key="w/index.json")["Body"].read()
    assert json.loads(body)["shards"] == json.loads((local / "index.json").read_bytes())["shards"]


def test_urls_where_they_do_not_belong_are_clear_errors(
    bucket: str, samples_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(StoreURLError, match="unknown URL scheme"):
        ShardDataset("s4://bucket/x")
    with pytest.raises(StoreURLError, match="local path"):
        read_index(f"s3://{bucket}/x")
    with pytest.raises(stoker.ConfigError, match="read-only"):
        pack(samples_dir, "https://example.invalid/x")
    with pytest.raises(IncompleteShardsError, match="does not exist"):
        ShardDataset(f"s3://{bucket}/nothing", cache_dir=tmp_path / "cache")
    with pytest.raises(stoker.ConfigError, match="cache_dir"):
        ShardDataset(tmp_path, cache_dir=tmp_path / "cache")
    assert not any(Path.cwd().glob("s3:*"))
    assert ShardCache(tmp_path / "c", "1MB").limit == 10**6
    assert os.environ["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")


def test_each_rank_downloads_only_the_shards_it_reads(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from _proxy import FaultProxy
    from store_helpers import point_at

    index = pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    with FaultProxy(s3_server.port) as proxy:
        point_at(monkeypatch, proxy.port)
        read: list[set[str]] = []
        for rank in (0, 1):
            ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / f"rank{rank}")
            world = stoker.World(rank=rank, world_size=2)
            read.append({s["__shard__"] for s in ds.stream(world=world, buffer_size=4)})
            ds.close()  # stops the prefetch
            fetched = {s.name for s in index.shards if proxy.gets(f"{bucket}/ds/{s.name}")}
            assert fetched == read[rank]
            proxy.requests.clear()
    assert read[0] | read[1] == {s.name for s in index.shards}


def test_a_stream_starts_on_its_first_shards_where_it_is_made(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _proxy import FaultProxy
    from store_helpers import point_at

    index = pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    assert len(index.shards) > _stream.EARLY_SHARDS
    with FaultProxy(s3_server.port) as proxy:
        point_at(monkeypatch, proxy.port)
        ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
        stream = ds.stream(seed=5)  # no iteration yet: the downloads start now
        first = stream._order(0)[: _stream.EARLY_SHARDS]
        names = [index.shards[k].name for k in first]
        for _ in range(int(EARLY_WAIT_S / EARLY_POLL_S)):
            if all(proxy.gets(f"ds/{n}") for n in names):
                break
            time.sleep(EARLY_POLL_S)
        fetched = {s.name for s in index.shards if proxy.gets(f"ds/{s.name}")}
        assert fetched == set(names), (fetched, names)
        keys = [k for b in stoker.DataLoader(stream, batch_size=8, num_workers=2)
                for k in b["__key__"]]  # fmt: skip
        assert sorted(keys) == sorted(k for s in index.shards for k in s.keys)
        # Each shard once on this machine: the workers found the early ones in the cache.
        assert [proxy.gets(f"ds/{s.name}") for s in index.shards] == [1] * len(index.shards)
        stream.set_epoch(1)  # the next epoch's first shards: already cached, none fetched
        ds.close()
        assert [proxy.gets(f"ds/{s.name}") for s in index.shards] == [1] * len(index.shards)


EARLY_WAIT_S = 10.0
EARLY_POLL_S = 0.02
