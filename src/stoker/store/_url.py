"""Store URLs: which are accepted, and how they are shown.

``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix`` (the account from
``AZURE_STORAGE_ACCOUNT_NAME``), ``http(s)://host/prefix`` (read only) and ``file:///path``
(a local path). Anything else with ``scheme://`` is refused: a typo such as ``s4://`` would
otherwise become a local folder named ``s4:``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from stoker.store._errors import StoreURLError

__all__ = ["SCHEMES", "StoreURL", "is_url", "local_path", "parse_url", "redact"]

Scheme = Literal["s3", "gs", "az", "http", "https"]
SCHEMES: tuple[str, ...] = ("s3", "gs", "az", "http", "https", "file")
_READ_ONLY = ("http", "https")
# "c:/data" is a Windows drive, not a scheme; a scheme is two or more letters before "://".
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
_SECRET_QUERY_RE = re.compile(r"\?[^\s'\"]*")
_USERINFO_RE = re.compile(r"(//)[^/@\s'\"]*@")


def redact(text: str) -> str:
    """``text`` without URL user info or query strings (a signed URL's secret is there)."""
    return _SECRET_QUERY_RE.sub("?...", _USERINFO_RE.sub(r"\1", text))


@dataclass(frozen=True)
class StoreURL:
    """A parsed remote URL.

    Attributes:
        scheme: ``"s3"``, ``"gs"``, ``"az"``, ``"http"`` or ``"https"``.
        root: what the client is built from (``s3://bucket``, ``https://host``).
        prefix: the key prefix below the root, without leading or trailing ``/``.
    """

    scheme: Scheme
    root: str
    prefix: str

    @property
    def writable(self) -> bool:
        return self.scheme not in _READ_ONLY

    def key(self, name: str) -> str:
        """The object key of ``name`` under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, name: str = "") -> str:
        """The URL of ``name`` under the prefix (of the prefix itself for ``""``), redacted."""
        key = self.key(name) if name else self.prefix
        return redact(f"{self.root}/{key}" if key else self.root)

    def __str__(self) -> str:
        return self.url()


def is_url(value: object) -> bool:
    """Whether ``value`` is a string of the form ``scheme://...`` (known scheme or not)."""
    return isinstance(value, str) and _SCHEME_RE.match(value) is not None


def parse_url(value: str | os.PathLike[str]) -> StoreURL | Path:
    """A remote URL as :class:`StoreURL`, anything else (``file://`` included) as a Path.

    Raises:
        StoreURLError: for an unknown scheme, a URL without a bucket or host, or a URL with a
            query or fragment (naming the value and the fix).
    """
    if not isinstance(value, str):
        return Path(value)
    match = _SCHEME_RE.match(value)
    if match is None:
        return Path(value)
    scheme = match.group(1).lower()
    shown = redact(value)
    if scheme not in SCHEMES:
        raise StoreURLError(
            f"unknown URL scheme {scheme + '://'!r} in {shown!r}: use one of "
            f"{', '.join(s + '://' for s in SCHEMES)}, or a local path."
        )
    parts = urlsplit(value)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StoreURLError(
                f"{shown!r} names host {parts.netloc!r}: a file:// URL is a local path, "
                "write it as file:///absolute/path."
            )
        return Path(unquote(parts.path))
    if not parts.netloc:
        what = "host" if scheme in _READ_ONLY else "bucket"
        raise StoreURLError(f"{shown!r} has no {what}: write {scheme}://{what}/prefix.")
    if parts.fragment or (parts.query and scheme not in _READ_ONLY):
        raise StoreURLError(
            f"{shown!r} has a query or fragment: pass the plain {scheme}://bucket/prefix; "
            "credentials and options come from the store's environment variables."
        )
    root = f"{scheme}://{parts.netloc}"
    return StoreURL(scheme=scheme, root=root, prefix=parts.path.strip("/"))  # type: ignore[arg-type]


def local_path(value: str | os.PathLike[str], what: str) -> Path:
    """``value`` as a local path, refusing a remote URL where only a local path works.

    Args:
        value: the argument.
        what: names the argument in the message (```out```, ``"the shard folder"``).

    Raises:
        StoreURLError: for a remote URL or an unknown scheme.
    """
    parsed = parse_url(value)
    if isinstance(parsed, StoreURL):
        raise StoreURLError(
            f"{what} must be a local path here. Found: {parsed.url()!r}: copy it to a local "
            "folder first."
        )
    return parsed
