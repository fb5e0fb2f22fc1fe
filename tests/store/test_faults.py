"""A store that fails: flaky requests, a server that dies, a shard corrupted in the store."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _proxy import FaultProxy
from store_helpers import S3, SHARD_SIZE, point_at

import stoker
from stoker.shards import CorruptShardError, ShardDataset, ShardError, pack
from stoker.store import _client, _retry

#: Hard limit on the child that watches a server die (its retries stop after RETRY_S).
CHILD_LIMIT_S = 60
RETRY_S = 1.0


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_retry, "TOTAL_SECONDS", 10.0)
    monkeypatch.setattr(_retry, "FIRST_DELAY", 0.01)
    monkeypatch.setattr(_retry, "MAX_DELAY", 0.05)


def test_a_server_failing_every_third_request_still_serves_every_sample(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, fast_retries: None,
) -> None:  # fmt: skip
    pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    with FaultProxy(s3_server.port, fail_every=3) as proxy:
        point_at(monkeypatch, proxy.port)
        ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
        keys = [k for b in stoker.DataLoader(ds.stream(), batch_size=8, num_workers=2)
                for k in b["__key__"]]  # fmt: skip
        assert sorted(keys) == sorted(k for s in ds.index.shards for k in s.keys)
        assert proxy.failed >= 5


def test_a_shard_corrupted_in_the_store_is_downloaded_twice_then_named(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    index = pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    bad = index.shards[1]
    client = s3_server.client()
    body = bytearray(client.get_object(Bucket=bucket, Key=f"ds/{bad.name}")["Body"].read())
    body[int(bad.offsets[0])] ^= 0xFF  # same size, one member byte flipped
    client.put_object(Bucket=bucket, Key=f"ds/{bad.name}", Body=bytes(body))
    with FaultProxy(s3_server.port) as proxy:
        point_at(monkeypatch, proxy.port)
        ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
        assert ds[0]["__key__"] == index.shards[0].keys[0]  # other shards still read
        with pytest.raises(CorruptShardError) as info:
            ds[index.shards[0].samples]
        assert proxy.gets(f"ds/{bad.name}") == 2
    assert bad.name in str(info.value) and f"s3://{bucket}/ds" in str(info.value)
    assert not list((tmp_path / "cache" / "objects").glob(".*.tmp"))  # nothing half-written


_DIES = """
import logging, os, sys, time
sys.path.insert(0, {here!r})
from moto.server import ThreadedMotoServer
from store_helpers import SHARD_SIZE, free_port
from stoker.store import _client, _retry
import stoker
from stoker.shards import ShardDataset, pack
logging.getLogger("werkzeug").setLevel(logging.ERROR)
_retry.TOTAL_SECONDS, _retry.FIRST_DELAY, _retry.MAX_DELAY = {retry}, 0.05, 0.2
port = free_port()
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
server.start()
os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{{port}}", AWS_ACCESS_KEY_ID="testing",
                  AWS_SECRET_ACCESS_KEY="testing-secret-key", AWS_REGION="us-east-1")
import boto3
boto3.client("s3").create_bucket(Bucket="dies")
pack({src!r}, "s3://dies/ds", shard_size=SHARD_SIZE)
ds = ShardDataset("s3://dies/ds", cache_dir={cache!r})
server.stop()
start = time.monotonic()
try:
    for batch in stoker.DataLoader(ds.stream(), batch_size=8, num_workers=2):
        pass
except Exception as exc:
    print("ERROR", type(exc).__name__, round(time.monotonic() - start, 1), exc)
"""


def test_a_server_that_dies_gives_a_clear_error_in_bounded_time(tmp_path: Path) -> None:
    src = tmp_path / "few"  # a few shards: the child packs them before the server dies
    src.mkdir()
    for i in range(16):
        (src / f"s{i:02d}.bin").write_bytes(bytes([i]) * 3000)
    code = _DIES.format(
        here=str(Path(__file__).parent), retry=RETRY_S, src=str(src),
        cache=str(tmp_path / "cache"),
    )  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=CHILD_LIMIT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("ERROR"))
    assert "StoreError" in line and "s3://dies/ds/shard-" in line, line
    assert re.search(r"\d+ attempts? in [\d.]+ s", line), line
    assert "testing-secret-key" not in done.stdout + done.stderr
    assert time.monotonic() - start < CHILD_LIMIT_S


def test_a_shard_comes_in_ranged_parts_each_retried_alone(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, fast_retries: None,
) -> None:  # fmt: skip
    index = pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    monkeypatch.setattr(_client, "PART_BYTES", 4000)
    shard = index.shards[0]
    parts = -(-shard.size // 4000)
    assert parts >= 3
    with FaultProxy(s3_server.port, fail_every=4) as proxy:
        point_at(monkeypatch, proxy.port)
        ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
        got = [ds[i] for i in range(shard.samples)]
        # One GET per part, and one more per failed GET (none fetches the whole object again).
        assert parts <= proxy.gets(f"ds/{shard.name}") < 2 * parts
        assert proxy.failed >= 1
    for i, sample in enumerate(got):
        stem = sample["__key__"]
        assert sample["bin"] == (samples_dir / f"{stem}.bin").read_bytes(), i


@pytest.mark.parametrize("change", ["shorter", "longer"])
def test_an_object_of_another_size_than_its_index_says_is_named(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, change: str,
) -> None:  # fmt: skip
    index = pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    monkeypatch.setattr(_client, "PART_BYTES", 4000)
    bad = index.shards[0]
    client = s3_server.client()
    body = client.get_object(Bucket=bucket, Key=f"ds/{bad.name}")["Body"].read()
    # Shorter by more than a part: a middle part's range starts past the object's end.
    body = body[: bad.size - 9000] if change == "shorter" else body + b"\0" * 512
    client.put_object(Bucket=bucket, Key=f"ds/{bad.name}", Body=body)
    point_at(monkeypatch, s3_server.port)
    ds = ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
    with pytest.raises(CorruptShardError) as info:
        ds[0]
    assert bad.name in str(info.value) and str(bad.size) in str(info.value)
    assert not list((tmp_path / "cache" / "objects").glob(".*.tmp"))  # nothing half-written


def test_an_index_over_its_limit_is_refused_in_one_request(
    s3_server: S3, bucket: str, samples_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    index = pack(samples_dir, f"s3://{bucket}/ds", shard_size=SHARD_SIZE)
    assert index.shards
    size = len(s3_server.client().get_object(Bucket=bucket, Key="ds/index.json")["Body"].read())
    monkeypatch.setattr("stoker.shards._remote.MAX_INDEX_BYTES", size - 1)
    with FaultProxy(s3_server.port) as proxy:
        point_at(monkeypatch, proxy.port)
        with pytest.raises(ShardError, match=f"more than the {size - 1} bytes allowed"):
            ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")
        assert proxy.gets("ds/index.json") == 1
        assert not [p for m, p in proxy.requests if m == "HEAD" and "index.json" in p]
    monkeypatch.setattr("stoker.shards._remote.MAX_INDEX_BYTES", size)
    point_at(monkeypatch, s3_server.port)
    assert len(ShardDataset(f"s3://{bucket}/ds", cache_dir=tmp_path / "cache")) == len(
        [k for s in index.shards for k in s.keys]
    )
