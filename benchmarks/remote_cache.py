"""Streaming shards from an S3-API server (moto's, on loopback): cold cache against warm.

    python benchmarks/remote_cache.py [--samples 4000] [--sample-bytes 4096] [--repeat 3]
    python benchmarks/remote_cache.py clients     # obstore against s3fs: list, GET, ranged GET

The default mode packs a synthetic dataset into a bucket, then runs epochs of
``stoker.DataLoader(ShardDataset(url).stream(), batch_size=32, num_workers=2)``: the first
with an empty cache folder (every shard downloaded), the next with the same folder (every
shard local). It prints samples/s and the time to the first batch of each. The server runs in
a process of its own; loopback has no network latency: the cold figure measures the server
and the cache, not a WAN.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


class _Server:
    """moto's S3 server in a process of its own (in this one it would share the GIL with the
    loader being measured)."""

    def __init__(self, port: int) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _server() -> tuple[_Server, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = _Server(port)
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_REGION="us-east-1",
    )
    return server, port


def _bucket(name: str) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)


def _epoch(url: str, cache: Path, workers: int, batch: int) -> tuple[float, float]:
    import stoker
    from stoker.shards import ShardDataset

    start = time.perf_counter()
    ds = ShardDataset(url, cache_dir=cache)
    loader = stoker.DataLoader(ds.stream(), batch_size=batch, num_workers=workers)
    first = 0.0
    samples = 0
    for b in loader:
        if not first:
            first = time.perf_counter() - start
        samples += len(b["__key__"])
    return samples / (time.perf_counter() - start), first


def epochs(args: argparse.Namespace) -> None:
    from stoker.shards import pack

    server, _ = _server()
    try:
        _bucket("bench")
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "src"
            src.mkdir()
            for i in range(args.samples):
                (src / f"s{i:06d}.bin").write_bytes(os.urandom(args.sample_bytes))
                (src / f"s{i:06d}.cls").write_text(str(i % 10))
            index = pack(src, "s3://bench/ds", shard_size=args.shard_size)
            size = sum(s.size for s in index.shards) / 1e6
            print(f"{args.samples} samples, {len(index.shards)} shards, {size:.1f} MB, "
                  f"{args.workers} workers, batch {args.batch}")  # fmt: skip
            cold, warm = [], []
            for r in range(args.repeat):
                cache = Path(tmp) / f"cache{r}"
                cold.append(_epoch("s3://bench/ds", cache, args.workers, args.batch))
                warm.append(_epoch("s3://bench/ds", cache, args.workers, args.batch))
            for name, runs in (("cold cache", cold), ("warm cache", warm)):
                rates = [r for r, _ in runs]
                firsts = [f for _, f in runs]
                print(f"{name}: {statistics.median(rates):8.0f} samples/s (runs "
                      f"{', '.join(f'{r:.0f}' for r in rates)}), first batch "
                      f"{statistics.median(firsts) * 1000:.0f} ms")  # fmt: skip
            ratio = statistics.median(r for r, _ in cold) / statistics.median(r for r, _ in warm)
            print(f"cold/warm: {ratio:.2f}")
    finally:
        server.stop()


def _median_ms(call: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def clients(args: argparse.Namespace) -> None:
    import boto3

    server, _ = _server()
    try:
        _bucket("clients")
        s3 = boto3.client("s3")
        count, size, span = 16, 8 << 20, 64 << 10
        blob = os.urandom(size)
        for i in range(count):
            s3.put_object(Bucket="clients", Key=f"p/o{i}", Body=blob)
        keys = [f"p/o{i}" for i in range(count)]
        offsets = [(i * span) % (size - span) for i in range(200)]
        rows = []
        try:
            import obstore
            from obstore.store import S3Store

            st = S3Store("clients", client_options={"allow_http": True})
            rows.append(("obstore", [
                lambda: list(obstore.list(st, "p/").collect()),
                lambda: [bytes(obstore.get(st, k).bytes()) for k in keys],
                lambda: [obstore.get_range(st, keys[i % count], start=o, length=span)
                         for i, o in enumerate(offsets)],
            ]))  # fmt: skip
        except ImportError:
            print("obstore not installed")
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        rows.append(("s3fs", [
            lambda: fs.ls("clients/p/", refresh=True),
            lambda: [fs.cat_file(f"clients/{k}") for k in keys],
            lambda: [fs.cat_file(f"clients/{keys[i % count]}", start=o, end=o + span)
                     for i, o in enumerate(offsets)],
        ]))  # fmt: skip
        print(f"{'client':10s} {'list 16':>10s} {'GET 16x8MB':>12s} {'200 ranged 64KB':>16s}  (ms)")
        for name, (ls, get, ranged) in rows:
            print(f"{name:10s} {_median_ms(ls, 5):10.1f} {_median_ms(get, 3):12.1f} "
                  f"{_median_ms(ranged, 3):16.1f}")  # fmt: skip
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", nargs="?", default="epochs", choices=["epochs", "clients"])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--sample-bytes", type=int, default=4096)
    parser.add_argument("--shard-size", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    (clients if args.mode == "clients" else epochs)(args)


if __name__ == "__main__":
    sys.exit(main())
