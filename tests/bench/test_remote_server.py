"""The bench's S3 server and proxy: latency, bandwidth cap, byte counts, clean stop.

Real moto server, real sockets. Durations are asserted only from below (the proxy's sleeps
set a floor that a loaded machine cannot lower), never from above.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stoker.bench._s3server import S3Endpoint, s3_server
from stoker.errors import ConfigError

pytest.importorskip("moto.server", reason="moto[server] is not installed (stoker[bench])")
pytest.importorskip("boto3", reason="boto3 is not installed (comes with moto)")

BUCKET = "test-remote-server"
# Headers and framing a response adds to its body, at most.
HEADER_SLACK = 4096
# Seconds moto's request threads may take to end once their connections close.
THREADS_END_S = 5.0


@pytest.fixture(scope="module")
def endpoint() -> Iterator[S3Endpoint]:
    with s3_server(latency_s=0.0, bandwidth=None) as ep:
        client = ep.client(direct=True)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="small", Body=b"s" * 1000)
        client.close()
        yield ep


def _get(ep: S3Endpoint, key: str, bucket: str = BUCKET) -> bytes:
    client = ep.client()
    try:
        body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body
    finally:
        client.close()


def _fill(ep: S3Endpoint, bucket: str, key: str, data: bytes) -> None:
    client = ep.client(direct=True)
    try:
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key=key, Body=data)
    finally:
        client.close()


def test_counts_the_bytes_and_requests_that_pass(endpoint: S3Endpoint) -> None:
    endpoint.reset()
    assert _get(endpoint, "small") == b"s" * 1000
    traffic = endpoint.reset()
    assert 1000 < traffic.bytes_down <= 1000 + HEADER_SLACK
    assert 0 < traffic.bytes_up <= HEADER_SLACK
    assert traffic.requests == 1
    assert traffic.connections == 1
    assert endpoint.traffic().bytes_down == 0  # reset started from zero


def test_direct_url_bypasses_the_proxy(endpoint: S3Endpoint) -> None:
    endpoint.reset()
    client = endpoint.client(direct=True)
    try:
        client.head_object(Bucket=BUCKET, Key="small")
    finally:
        client.close()
    assert endpoint.traffic().requests == 0


def test_latency_is_added_to_every_request() -> None:
    latency = 0.25
    with s3_server(latency_s=latency, bandwidth=None) as ep:
        _fill(ep, "test-latency", "k", b"x")
        client = ep.client()
        try:
            client.head_object(Bucket="test-latency", Key="k")  # connection set up
            t0 = time.monotonic()
            for _ in range(3):
                client.head_object(Bucket="test-latency", Key="k")
            elapsed = time.monotonic() - t0
        finally:
            client.close()
        assert ep.traffic().requests == 4
    assert elapsed >= 3 * latency


def test_bandwidth_is_capped_per_connection() -> None:
    bandwidth = 4e6
    size = 2 * 10**6
    with s3_server(latency_s=0.0, bandwidth=bandwidth) as ep:
        _fill(ep, "test-cap", "big", os.urandom(size))
        t0 = time.monotonic()
        assert len(_get(ep, "big", "test-cap")) == size
        elapsed = time.monotonic() - t0
        assert ep.traffic().bytes_down >= size
    # The pacer sleeps after each chunk for its share of the second: only the last
    # chunk's sleep may fall after the client has its bytes.
    assert elapsed >= (size - 64 * 1024) / bandwidth


def _threads() -> set[threading.Thread]:
    return set(threading.enumerate())


def test_stops_cleanly_leaving_no_thread_or_listening_socket() -> None:
    before = _threads()
    with s3_server(latency_s=0.01, bandwidth=1e8) as ep:
        _fill(ep, "test-stop", "k", b"y" * 10_000)
        client: Any = ep.client()
        client.get_object(Bucket="test-stop", Key="k")["Body"].read()  # a kept-alive connection
        ports = [int(u.rsplit(":", 1)[1]) for u in (ep.url, ep.direct_url)]
    client.close()
    deadline = time.monotonic() + THREADS_END_S
    while _threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _threads() - before
    for port in ports:
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass


def test_a_client_still_connected_at_exit_is_disconnected() -> None:
    with s3_server(latency_s=0.0, bandwidth=None) as ep:
        port = int(ep.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(THREADS_END_S)
        assert sock.recv(16)  # the response has started
    try:
        sock.settimeout(THREADS_END_S)
        while sock.recv(65536):  # the rest of the response, then the proxy's close
            pass
    finally:
        sock.close()


def test_environ_points_clients_at_the_proxy_and_is_restored(endpoint: S3Endpoint) -> None:
    old = os.environ.get("AWS_ENDPOINT_URL")
    with endpoint.environ() as values:
        assert os.environ["AWS_ENDPOINT_URL"] == endpoint.url == values["AWS_ENDPOINT_URL"]
    assert os.environ.get("AWS_ENDPOINT_URL") == old
    assert endpoint.env(direct=True)["AWS_ENDPOINT_URL"] == endpoint.direct_url


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"latency_s": -1}, "`latency_s`"),
        ({"latency_s": float("nan")}, "`latency_s`"),
        ({"bandwidth": 0}, "`bandwidth`"),
        ({"bandwidth": "fast"}, "`bandwidth`"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named), s3_server(**kwargs):
        pass
