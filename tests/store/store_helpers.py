"""Helpers for the store tests (a module of its own: every test folder has a `conftest`)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

SAMPLES = 60
SHARD_SIZE = 16_000


@dataclass
class S3:
    port: int
    endpoint: str

    def client(self):  # boto3 comes with moto: used only to set up and inspect buckets
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing-secret-key",
            region_name="us-east-1",
        )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def point_at(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    """The store's standard environment, aimed at a server on ``port``."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-key")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
