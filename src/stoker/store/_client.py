"""A small client over ``fsspec`` (``s3fs``; ``gcsfs``, ``adlfs`` for gs:// and az://).

Chosen by measurement against moto's S3 server on loopback (benchmarks/README.md, "Object
storage clients"): obstore (Rust object_store) was faster at listing, whole-object and ranged
GETs, but its process-wide tokio runtime does not survive ``fork``: a DataLoader worker forked
after the main process had fetched the index hung or crashed. fsspec resets its event loop in a
forked child, so each worker builds its own client and works.

Configuration comes only from each store's standard environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``AZURE_STORAGE_*``); stoker adds none of its own. The clients' own retries are off: every
request goes through :func:`stoker.store._retry.with_retries`, so the final error can name the
attempts.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from stoker.store._errors import ObjectMismatchError, StoreError, StoreURLError
from stoker.store._retry import RetryPolicy, with_retries
from stoker.store._secrets import scrub
from stoker.store._url import StoreURL

__all__ = [
    "CONNECT_TIMEOUT",
    "PART_BYTES",
    "PART_CONNECTIONS",
    "READ_TIMEOUT",
    "Store",
    "open_store",
]

#: Per request, in seconds; a stalled server then fails the attempt instead of hanging it.
CONNECT_TIMEOUT = 5
READ_TIMEOUT = 60
_CHUNK = 1 << 20
#: Bytes per ranged GET of a download, and the parts of one download in flight at a time:
#: 8 MiB parts, 4 at a time, took a 32 MB object through a 50 ms, 50 MB/s-per-connection
#: proxy in 0.27-0.43 s against 1.23-1.26 s in one GET (benchmarks/README.md, issue 28).
PART_BYTES = 8 << 20
PART_CONNECTIONS = 4
_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs", "http": "aiohttp", "https": "aiohttp"}


_loader: Any = None


def _s3_session() -> Any:
    """A fresh aiobotocore session sharing one botocore data loader per process tree: the
    loader caches the parsed service models (pure data, safe across fork), which a new
    session otherwise reads again in every worker (half a second here)."""
    global _loader
    import aiobotocore.session
    import botocore.loaders

    if _loader is None:
        _loader = botocore.loaders.create_loader()
    session = aiobotocore.session.AioSession()
    session.register_component("data_loader", _loader)
    return session


def _filesystem(scheme: str) -> Any:
    try:
        import fsspec

        if scheme == "s3":
            fs = fsspec.filesystem(
                "s3",
                skip_instance_cache=True,
                session=_s3_session(),
                config_kwargs={
                    "retries": {"max_attempts": 1, "mode": "standard"},
                    "connect_timeout": CONNECT_TIMEOUT,
                    "read_timeout": READ_TIMEOUT,
                },
            )
            fs.retries = 1  # s3fs's own retry loop; ours names the attempts
            return fs
        return fsspec.filesystem(scheme, skip_instance_cache=True)
    except ImportError:
        raise StoreURLError(
            f"{scheme}:// needs the `remote` extra and {_PACKAGES.get(scheme, scheme)}: "
            f"pip install 'stoker[remote]' {_PACKAGES.get(scheme, '')}".rstrip()
            + "."
        ) from None


class Store:
    """Requests to the objects under one :class:`StoreURL`'s prefix.

    Args:
        url: the prefix.
        policy: retry policy. Default ``None``: the module defaults of ``_retry``.

    Raises:
        StoreURLError: if the scheme's fsspec package is not installed, or the URL cannot
            configure a client.
    """

    def __init__(self, url: StoreURL, policy: RetryPolicy | None = None) -> None:
        self.url = url
        self.policy = policy
        self._client: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        # The client holds an event loop and sockets: each process builds its own.
        return {**self.__dict__, "_client": None, "_pid": -1}

    def _fs(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            try:
                self._client = _filesystem(self.url.scheme)
            except StoreURLError:
                raise
            except Exception as exc:
                raise StoreURLError(
                    f"cannot configure a client for {self.url.url()!r}: {scrub(str(exc))}"
                ) from None
            self._pid = os.getpid()
        return self._client

    def _path(self, name: str) -> str:
        """The fsspec path of ``name`` (``bucket/prefix/name``; a full URL over HTTP)."""
        key = self.url.key(name) if name else self.url.prefix
        if self.url.scheme in ("http", "https"):
            return f"{self.url.root}/{key}"
        host = self.url.root.split("://", 1)[1]
        return f"{host}/{key}" if key else host

    def _retry(self, call: Any, name: str, what: str) -> Any:
        return with_retries(call, url=self.url.url(name), what=what, policy=self.policy)

    def size(self, name: str) -> int:
        """The object's size in bytes.

        Raises:
            ObjectMissingError: no such object.
            StoreError: the request failed after retries.
        """
        path = self._path(name)
        info = self._retry(lambda: self._fs().info(path), name, "HEAD")
        if info.get("type") == "directory" or info.get("size") is None:
            raise FileNotFoundError(path)
        return int(info["size"])

    def exists(self, name: str) -> bool:
        try:
            self.size(name)
        except FileNotFoundError:
            return False
        return True

    def get(self, name: str, limit: int) -> bytes:
        """The whole object, refused when larger than ``limit`` bytes.

        Raises:
            ObjectMissingError: no such object.
            ObjectMismatchError: it is larger than ``limit``.
            StoreError: the request failed after retries.
        """
        path = self._path(name)
        # One GET of at most one byte past the limit (no HEAD first: each request pays the
        # store's latency, and opening a remote dataset waits for this one).
        data = self._retry(lambda: self._fs().cat_file(path, start=0, end=limit + 1), name, "GET")
        if len(data) > limit:
            raise ObjectMismatchError(
                f"{self.url.url(name)} is more than the {limit} bytes allowed.",
                url=self.url.url(name),
            )
        return bytes(data)

    def download(self, name: str, out: BinaryIO, size: int) -> str:
        """Write the object into ``out`` (a regular file open for reading and writing, at
        most ``size`` bytes); return its sha256.

        The object comes in parts of :data:`PART_BYTES`, up to :data:`PART_CONNECTIONS` at a
        time, each written at its offset (``out`` is never truncated: the cache sizes it
        beforehand to reserve the space); a part that fails is retried alone. One GET per
        part, not per read: a request pays the store's latency, and a 32 MB shard read as
        1 MiB reads (s3fs with no read-ahead) paid it 32 times.

        Raises:
            ObjectMismatchError: the object is not ``size`` bytes.
            StoreError: a request failed after retries.
        """
        path = self._path(name)
        out.flush()
        fd = out.fileno()
        fs = self._fs()  # built once here, not raced for by the parts' threads

        def mismatch(got: str) -> ObjectMismatchError:
            return ObjectMismatchError(
                f"{self.url.url(name)} is {got} bytes, the index says {size}.",
                url=self.url.url(name),
            )

        def fetch(span: tuple[int, int]) -> None:
            start, end = span
            # The last part asks for one byte more: an object longer than the index shows.
            ask = end + 1 if end == size else end

            def attempt() -> None:
                data = memoryview(fs.cat_file(path, start=start, end=ask))
                if len(data) > end - start:
                    raise mismatch(f"more than {size}")
                if len(data) < end - start:  # a ranged GET stops short only at the object's end
                    raise mismatch(str(start + len(data)))
                written = 0
                while written < len(data):
                    written += os.pwrite(fd, data[written:], start + written)

            self._retry(attempt, name, "GET")

        spans = [(a, min(size, a + PART_BYTES)) for a in range(0, size, PART_BYTES)] or [(0, 0)]
        if len(spans) == 1:
            fetch(spans[0])
        else:
            with ThreadPoolExecutor(
                min(len(spans), PART_CONNECTIONS), thread_name_prefix="stoker-part"
            ) as pool:
                for done in [pool.submit(fetch, span) for span in spans]:
                    done.result()  # the first failure, in part order
        digest = hashlib.sha256()
        at = 0
        while at < size:
            chunk = os.pread(fd, min(_CHUNK, size - at), at)
            if not chunk:
                raise mismatch(f"only {at} of the written")  # the file was cut under us
            digest.update(chunk)
            at += len(chunk)
        return digest.hexdigest()

    def put(self, name: str, data: bytes | Path) -> None:
        """Upload bytes or a local file (s3fs uploads a large file in parts)."""
        if not self.url.writable:
            raise StoreURLError(
                f"{self.url.url()} is read-only ({self.url.scheme}://): write to s3://, gs:// "
                "or az://, or a local folder."
            )
        path = self._path(name)
        if isinstance(data, Path):
            self._retry(lambda: self._fs().put_file(str(data), path), name, "PUT")
        else:
            self._retry(lambda: self._fs().pipe_file(path, data), name, "PUT")

    def delete(self, name: str) -> None:
        path = self._path(name)
        self._retry(lambda: self._fs().rm_file(path), name, "DELETE")

    def names(self) -> Iterator[str]:
        """Object names directly under the prefix (one listing, retried as a whole)."""
        base = self._path("")

        def listing() -> list[str]:
            try:
                return list(self._fs().ls(base, detail=False, refresh=True))
            except FileNotFoundError:
                return []

        paths: list[str] = self._retry(listing, "", "LIST")
        cut = len(base.rstrip("/")) + 1
        yield from (p[cut:] for p in paths if p.startswith(base.rstrip("/") + "/"))


def open_store(url: StoreURL, policy: RetryPolicy | None = None) -> Store:
    """A :class:`Store` for ``url``; the client is built on first use in each process."""
    if not isinstance(url, StoreURL):
        raise StoreError(f"`url` must be a StoreURL. Found: {url!r}.")
    return Store(url, policy)
