"""Keeps credentials out of messages: the values of the stores' secret variables, and URL
user info and query strings, are replaced before any client text is shown."""

from __future__ import annotations

import os

from stoker.store._url import redact

__all__ = ["SECRET_VARIABLES", "scrub"]

SECRET_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET",
)
# Shorter values would blank ordinary words.
_MIN_SECRET = 6


def scrub(text: str) -> str:
    """``text`` with every secret variable's value replaced by ``***`` and URLs redacted."""
    for name in SECRET_VARIABLES:
        value = os.environ.get(name, "")
        if len(value) >= _MIN_SECRET:
            text = text.replace(value, "***")
    return redact(text)
