"""Errors raised by object-storage access.

::

    StokerError
    ├── ConfigError
    │   └── StoreURLError          a URL (or a URL where only a local path works) cannot be used
    └── StoreError                 a request to a store failed for good (after retries)
        ├── ObjectMissingError     the object does not exist (also FileNotFoundError)
        └── ObjectMismatchError    downloaded bytes differ from the size or sha256 expected

Messages name the URL (without user, password or query: signed URLs carry their secret
there), the HTTP status where there was one, and the number of attempts; never a credential.
"""

from __future__ import annotations

from stoker.errors import ConfigError, StokerError

__all__ = ["ObjectMismatchError", "ObjectMissingError", "StoreError", "StoreURLError"]


class StoreError(StokerError):
    """A store request failed for good; the message names the URL, status and attempts."""


class StoreURLError(StoreError, ConfigError):
    """A URL has an unknown scheme, no bucket, or was given where only a local path works."""


class ObjectMissingError(StoreError, FileNotFoundError):
    """The object does not exist in the store."""


class ObjectMismatchError(StoreError):
    """Downloaded bytes differ from the size or checksum the caller expected.

    Attributes:
        url: the object's URL (safe to show).
    """

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_mismatch, (str(self), self.url))


def _rebuild_mismatch(message: str, url: str) -> ObjectMismatchError:
    return ObjectMismatchError(message, url=url)
