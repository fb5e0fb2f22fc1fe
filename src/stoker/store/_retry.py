"""Retries with exponential backoff and full jitter, within a bounded total time.

Transient failures (timeouts, dropped or refused connections, HTTP 408, 429, 5xx and the
stores' throttling codes) are retried; anything else (403, 404, a bad request) fails at once.
When the time is up the last failure becomes one :class:`StoreError` naming the URL, the
status and the number of attempts.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from stoker.store._errors import ObjectMissingError, StoreError
from stoker.store._secrets import scrub

__all__ = ["RetryPolicy", "status_of", "transient", "with_retries"]

T = TypeVar("T")

#: Defaults, read at each call (tests shrink them).
TOTAL_SECONDS = 60.0
FIRST_DELAY = 0.1
MAX_DELAY = 5.0

_STATUS_RE = re.compile(r"\b(?:status(?: code)?:?\s*|HTTP\s*)([1-5]\d\d)\b", re.IGNORECASE)
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_WORDS = (
    "timed out",
    "timeout",
    "connection",
    "connect error",
    "error sending request",
    "broken pipe",
    "reset by peer",
    "incomplete",
    "unexpected eof",
    "slowdown",
    "slow down",
    "service unavailable",
    "internalerror",
    "requesttimeout",
    "cannot connect",
    "could not connect",
    "server disconnected",
    "throttl",
    "body error",
    "error decoding response body",
)


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often to retry.

    Attributes:
        total_seconds: no new attempt starts after this long since the first.
        first_delay: the first backoff's upper bound, doubled each attempt.
        max_delay: the largest backoff.
    """

    total_seconds: float
    first_delay: float
    max_delay: float

    def __post_init__(self) -> None:
        for name in ("total_seconds", "first_delay", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise StoreError(f"`{name}` must be a number >= 0. Found: {value!r}.")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status a client error names, if any."""
    match = _STATUS_RE.search(str(exc))
    return int(match.group(1)) if match else None


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` may succeed when tried again."""
    if isinstance(exc, FileNotFoundError | PermissionError | ObjectMissingError):
        return False
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    status = status_of(exc)
    if status is not None:
        return status in _TRANSIENT_STATUS
    text = str(exc).lower()
    return any(word in text for word in _TRANSIENT_WORDS)


def with_retries(
    call: Callable[[], T],
    *,
    url: str,
    what: str,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, retried on transient failures with backoff and jitter.

    Args:
        call: the request.
        url: names the object in the error (already redacted).
        what: the operation, for the message (``"GET"``, ``"PUT"``).
        policy: default: :data:`TOTAL_SECONDS`, :data:`FIRST_DELAY`, :data:`MAX_DELAY`.
        sleep, clock: injectable for tests.

    Raises:
        ObjectMissingError: the object does not exist (not retried).
        StoreError: any other failure, after the retries the policy allows.
    """
    policy = policy or RetryPolicy(TOTAL_SECONDS, FIRST_DELAY, MAX_DELAY)
    start = clock()
    attempts = 0
    while True:
        attempts += 1
        try:
            return call()
        except FileNotFoundError:
            raise ObjectMissingError(f"{what} {url}: no such object in the store.") from None
        except Exception as exc:
            if isinstance(exc, StoreError) and not transient(exc):
                raise
            delay = random.uniform(
                0, min(policy.max_delay, policy.first_delay * 2 ** (attempts - 1))
            )
            elapsed = clock() - start
            if not transient(exc) or elapsed + delay > policy.total_seconds:
                raise _final(exc, url, what, attempts, elapsed, transient(exc)) from None
            sleep(delay)


def _final(
    exc: BaseException, url: str, what: str, attempts: int, elapsed: float, retried: bool
) -> StoreError:
    status = status_of(exc)
    said = f"HTTP status {status}" if status is not None else "no HTTP status"
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''} in {elapsed:.1f} s"
    hint = (
        "the store kept failing; check it is up and reachable (AWS_ENDPOINT_URL and the "
        "network), then retry."
        if retried
        else "not retried: check the URL, the bucket and the credentials in the environment."
    )
    detail = " ".join(scrub(str(exc)).split())[:300]
    return StoreError(f"{what} {url} failed ({said}, {tries}): {detail}. {hint}")
