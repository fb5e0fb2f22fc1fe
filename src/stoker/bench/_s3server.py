"""A local S3-API server behind a proxy that adds latency and caps bandwidth.

:func:`s3_server` starts moto's S3 server (``moto[server]``, in a thread of this process) on a
free loopback port and a small TCP proxy in front of it; clients talk to the proxy, which

- delays the first byte of every response by ``latency_s`` (one request's round trip to a
  distant store; a response follows each burst of bytes the client sends, so any HTTP/1.1
  client is served without the proxy parsing HTTP),
- sends at most ``bandwidth`` bytes per second on each connection, in each direction,
- counts the bytes, requests and connections that pass (:class:`Traffic`).

Used by the ``remote`` bench workload and by tests of code that reads from S3::

    with s3_server(latency_s=0.05, bandwidth=50e6) as endpoint, endpoint.environ():
        client = endpoint.client()
        client.create_bucket(Bucket="data")
        ...  # any client that reads AWS_ENDPOINT_URL (boto3, obstore, s3fs) reaches the proxy
        print(endpoint.traffic().bytes_down)

moto keeps buckets in process-wide memory: two servers in one process share them, so give
each use its own bucket name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stoker.errors import ConfigError

__all__ = ["DEFAULT_BANDWIDTH", "DEFAULT_LATENCY_S", "S3Endpoint", "Traffic", "s3_server"]

DEFAULT_LATENCY_S = 0.05
DEFAULT_BANDWIDTH = 50e6  # bytes per second per connection
# Bytes the proxy reads at a time: small enough that the cap paces in steps under 2 ms.
CHUNK = 64 * 1024
# Seconds the proxy's and moto's threads may take to stop.
STOP_TIMEOUT_S = 10.0
# Credentials moto accepts (any value works; these name themselves as fake).
FAKE_KEY_ID = "testing"
FAKE_SECRET = "testing"
REGION = "us-east-1"


@dataclass(frozen=True)
class Traffic:
    """What passed through the proxy since it started (or since :meth:`S3Endpoint.reset`).

    Attributes:
        bytes_down: bytes from the server to clients (downloads, response headers included).
        bytes_up: bytes from clients to the server (requests, uploads).
        requests: responses started (one per request).
        connections: connections accepted.
    """

    bytes_down: int = 0
    bytes_up: int = 0
    requests: int = 0
    connections: int = 0


class _Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = Traffic()

    def add(self, **deltas: int) -> None:
        with self._lock:
            now = self._values
            self._values = Traffic(**{k: getattr(now, k) + deltas.get(k, 0) for k in vars(now)})

    def read(self, reset: bool = False) -> Traffic:
        with self._lock:
            values = self._values
            if reset:
                self._values = Traffic()
            return values


class _Pacer:
    """Spaces writes so that one direction of one connection stays under ``bandwidth``."""

    def __init__(self, bandwidth: float | None) -> None:
        self.bandwidth = bandwidth
        self.free_at = 0.0

    async def after(self, nbytes: int) -> None:
        if self.bandwidth is None:
            return
        now = time.monotonic()
        self.free_at = max(self.free_at, now) + nbytes / self.bandwidth
        if self.free_at > now:
            await asyncio.sleep(self.free_at - now)


class _Proxy:
    """An asyncio TCP proxy run by its own thread (see the module docstring)."""

    def __init__(
        self, upstream: tuple[str, int], host: str, latency_s: float, bandwidth: float | None
    ) -> None:
        self.upstream, self.host = upstream, host
        self.latency_s, self.bandwidth = latency_s, bandwidth
        self.counter = _Counter()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="stoker-s3-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join(STOP_TIMEOUT_S)
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, self.host, 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError as exc:
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        future.result(STOP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)

    async def _close(self) -> None:
        assert self._server is not None  # set before _ready
        self._server.close()
        await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a handler always runs in a task
        self._tasks.add(task)
        self.counter.add(connections=1)
        upstream_w: asyncio.StreamWriter | None = None
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.upstream)
            asked = asyncio.Event()  # the client has sent bytes no response has followed yet
            await asyncio.gather(
                self._pump(client_r, upstream_w, "bytes_up", asked, request=True),
                self._pump(upstream_r, client_w, "bytes_down", asked, request=False),
            )
        except (OSError, asyncio.IncompleteReadError):
            pass  # a peer went away: the other side is closed below
        finally:
            for writer in (client_w, upstream_w):
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
            self._tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        field: str,
        asked: asyncio.Event,
        *,
        request: bool,
    ) -> None:
        pacer = _Pacer(self.bandwidth)
        while True:
            data = await reader.read(CHUNK)
            if not data:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            if request:
                asked.set()
            elif asked.is_set():  # the first bytes of a response
                asked.clear()
                self.counter.add(requests=1)
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
            self.counter.add(**{field: len(data)})  # before the peer can see the bytes
            writer.write(data)
            await writer.drain()
            await pacer.after(len(data))


@dataclass
class S3Endpoint:
    """A running :func:`s3_server`.

    Attributes:
        url: the proxy's URL (``http://127.0.0.1:PORT``): what clients should use.
        direct_url: moto's own URL, without latency, cap or counting (to fill buckets fast).
        latency_s: seconds added before each response.
        bandwidth: bytes per second per connection and direction (``None``: no cap).
    """

    url: str
    direct_url: str
    latency_s: float
    bandwidth: float | None
    _proxy: _Proxy

    def traffic(self) -> Traffic:
        """What has passed through the proxy so far."""
        return self._proxy.counter.read()

    def reset(self) -> Traffic:
        """Return the traffic so far and start counting from zero."""
        return self._proxy.counter.read(reset=True)

    def env(self, direct: bool = False) -> dict[str, str]:
        """Environment variables that point S3 clients at this server (fake credentials).

        Args:
            direct: point them at moto itself instead of the proxy. Default ``False``.
        """
        return {
            "AWS_ENDPOINT_URL": self.direct_url if direct else self.url,
            "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",  # obstore (object_store) refuses plain HTTP without it
        }

    @contextlib.contextmanager
    def environ(self, direct: bool = False) -> Iterator[dict[str, str]]:
        """Set :meth:`env` in ``os.environ`` (inherited by workers), restored on exit."""
        values = self.env(direct)
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield values
        finally:
            for key, old in saved.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old

    def client(self, direct: bool = False) -> Any:
        """A boto3 S3 client for this server (through the proxy unless ``direct``)."""
        import boto3  # lazy: boto3 is an optional dependency that takes long to import

        return boto3.client(
            "s3",
            endpoint_url=self.direct_url if direct else self.url,
            aws_access_key_id=FAKE_KEY_ID,
            aws_secret_access_key=FAKE_SECRET,
            region_name=REGION,
        )


def _check(latency_s: float, bandwidth: float | None) -> None:
    if not isinstance(latency_s, (int, float)) or not math.isfinite(latency_s) or latency_s < 0:
        raise ConfigError(f"`latency_s` must be a number of seconds >= 0. Found: {latency_s!r}.")
    if bandwidth is not None and (
        not isinstance(bandwidth, (int, float)) or not math.isfinite(bandwidth) or bandwidth <= 0
    ):
        raise ConfigError(
            f"`bandwidth` must be bytes per second > 0, or None for no cap. Found: {bandwidth!r}."
        )


@contextlib.contextmanager
def s3_server(
    *,
    latency_s: float = DEFAULT_LATENCY_S,
    bandwidth: float | None = DEFAULT_BANDWIDTH,
    host: str = "127.0.0.1",
) -> Iterator[S3Endpoint]:
    """Run moto's S3 server behind a latency-and-bandwidth proxy for the ``with`` block.

    Args:
        latency_s: seconds added before the first byte of each response. Default 0.05.
        bandwidth: bytes per second per connection and direction; ``None``: no cap.
            Default 50e6.
        host: the loopback address both listen on. Default ``"127.0.0.1"``.

    Yields:
        The running :class:`S3Endpoint`. Both servers stop on exit, closing every
        connection.

    Raises:
        ConfigError: for a negative latency or a bandwidth <= 0.
        ImportError: if ``moto[server]`` is not installed (``pip install 'stoker[bench]'``).
    """
    _check(latency_s, bandwidth)
    try:  # lazy: moto imports flask and every AWS backend's models (seconds)
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        raise ImportError(
            "the S3 server needs moto's server: pip install 'moto[server]' (or 'stoker[bench]')."
        ) from exc
    moto = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    access_log = logging.getLogger("werkzeug")
    level = access_log.level
    access_log.setLevel(logging.WARNING)  # one line per request otherwise
    moto.start()
    try:
        moto_host, moto_port = moto.get_host_and_port()
        proxy = _Proxy((moto_host, moto_port), host, float(latency_s), bandwidth)
        proxy.start()
        try:
            yield S3Endpoint(
                url=f"http://{host}:{proxy.port}",
                direct_url=f"http://{moto_host}:{moto_port}",
                latency_s=float(latency_s),
                bandwidth=bandwidth,
                _proxy=proxy,
            )
        finally:
            proxy.stop()
    finally:
        moto.stop()
        access_log.setLevel(level)
