"""A real S3-API server (moto's, on a free loopback port) for the store tests."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from store_helpers import S3, SAMPLES, free_port, point_at  # noqa: E402 (needs HERE on sys.path)

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
pytest.importorskip("s3fs", reason="needs s3fs (the remote extra)")


@pytest.fixture(scope="session", autouse=True)
def _fsspec_loop_running() -> None:
    """Start fsspec's process-wide event loop (its thread and fds live as long as the process)
    before the first test, so the leak check does not blame the test that needed it first."""
    import fsspec.asyn

    fsspec.asyn.get_loop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3(port, f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server: S3, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; the environment points the store client at the server."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    point_at(monkeypatch, s3_server.port)
    return name


@pytest.fixture
def samples_dir(tmp_path: Path) -> Path:
    """A folder of SAMPLES samples (files grouped by stem): about 12 shards of SHARD_SIZE."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(SAMPLES):
        (src / f"s{i:04d}.bin").write_bytes(os.urandom(1500) + bytes([i % 256]))
        (src / f"s{i:04d}.cls").write_text(str(i))
    return src
