"""Untrusted text (file names, a log's strings) made safe to print on a terminal."""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 controls but tab and newline, DEL, and C1 controls: what a terminal acts on.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with terminal control characters written as ``\\xNN``: a shard or log named
    with an escape sequence must not clear the user's screen or set their window title."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
