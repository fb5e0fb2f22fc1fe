"""URLs, sizes, redaction and the retry loop (an injected clock: no waiting)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.errors import ConfigError
from stoker.store import (
    ObjectMissingError,
    RetryPolicy,
    StoreError,
    StoreURL,
    StoreURLError,
    local_path,
    parse_bytes,
    parse_url,
    scrub,
    with_retries,
)


def test_store_urls_parse_into_root_and_prefix() -> None:
    url = parse_url("s3://bucket/some/prefix/")
    assert isinstance(url, StoreURL)
    assert (url.scheme, url.root, url.prefix) == ("s3", "s3://bucket", "some/prefix")
    assert url.key("index.json") == "some/prefix/index.json"
    assert url.url("a.tar") == "s3://bucket/some/prefix/a.tar"
    assert parse_url("gs://b").prefix == ""  # type: ignore[union-attr]
    assert not parse_url("https://host/x").writable  # type: ignore[union-attr]


def test_local_paths_and_file_urls_are_paths() -> None:
    assert parse_url("data/shards") == Path("data/shards")
    assert parse_url("file:///tmp/x") == Path("/tmp/x")
    assert parse_url(Path("s3:")) == Path("s3:")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("s4://bucket/x", ["unknown URL scheme 's4://'", "s3://"]),
        ("s3:///x", ["has no bucket"]),
        ("s3://b/x?versionId=1", ["query or fragment"]),
        ("file://otherhost/x", ["file:///absolute/path"]),
    ],
)
def test_bad_urls_name_the_value_and_the_fix(value: str, words: list[str]) -> None:
    with pytest.raises(StoreURLError) as info:
        parse_url(value)
    for word in words:
        assert word in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_a_url_where_only_a_local_path_works_is_refused() -> None:
    with pytest.raises(StoreURLError, match="must be a local path"):
        local_path("s3://b/x", "`directory`")


def test_sizes_accept_units_and_ints() -> None:
    assert parse_bytes("20GB") == 20 * 10**9
    assert parse_bytes("1GiB") == 2**30
    assert parse_bytes(4096) == 4096
    assert parse_bytes(None) is None
    for bad in ("lots", 0, -1, True, "0MB"):
        with pytest.raises(ConfigError, match="cache_limit"):
            parse_bytes(bad)  # type: ignore[arg-type]


def test_messages_never_show_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-123")
    text = scrub("auth failed with s3cr3t-value-123 at https://user:pw@host/k?X-Amz-Signature=ab")
    assert "s3cr3t" not in text and "pw@" not in text and "Signature" not in text


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


def test_transient_errors_are_retried_until_they_succeed() -> None:
    clock, calls = _Clock(), []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise RuntimeError("Server returned non-2xx status code: 503 Service Unavailable")
        return "ok"

    policy = RetryPolicy(total_seconds=30, first_delay=0.1, max_delay=1)
    got = with_retries(
        flaky, url="s3://b/k", what="GET", policy=policy, sleep=clock.sleep, clock=clock
    )
    assert got == "ok" and len(calls) == 4
    assert all(0 <= s <= 0.1 * 2**i for i, s in enumerate(clock.sleeps))  # backoff bounds


def test_retries_stop_within_the_total_time_with_one_clear_error() -> None:
    clock = _Clock()

    def down() -> None:
        raise RuntimeError("error sending request: Connection refused (os error 111)")

    policy = RetryPolicy(total_seconds=5, first_delay=0.5, max_delay=2)
    with pytest.raises(StoreError) as info:
        with_retries(
            down, url="s3://b/k", what="GET", policy=policy, sleep=clock.sleep, clock=clock
        )
    text = str(info.value)
    assert "GET s3://b/k failed" in text and "attempts" in text and "no HTTP status" in text
    assert clock.now <= 5


def test_permanent_errors_are_not_retried() -> None:
    clock = _Clock()
    for exc, kind in (
        (FileNotFoundError("nope"), ObjectMissingError),
        (RuntimeError("status code: 403 Forbidden"), StoreError),
    ):

        def fail(exc: Exception = exc) -> None:
            raise exc

        with pytest.raises(kind) as info:
            with_retries(fail, url="s3://b/k", what="GET", sleep=clock.sleep, clock=clock)
        assert "s3://b/k" in str(info.value)
    assert clock.sleeps == []
