"""Checking, before a long run, that the file it ends by writing can be written."""

from __future__ import annotations

import os
from pathlib import Path

from stoker.errors import ConfigError

__all__ = ["check_output_path"]


def check_output_path(path: str | os.PathLike[str], option: str) -> None:
    """Raise :class:`ConfigError` now if ``path`` could not be written later.

    ``stoker bench`` and ``stoker tune`` write their files after minutes of measuring; a
    missing folder found only then loses the measurements.

    Args:
        path: the file to be written (created or replaced).
        option: the command-line option that named it, for the message.
    """
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ConfigError(f"`{option} {path}` is a directory: name a file in it.")
    if not parent.is_dir():
        raise ConfigError(
            f"`{option} {path}`: the folder {str(parent)!r} does not exist. Create it first, "
            "or name a file in an existing folder."
        )
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"`{option} {path}`: no permission to write there.")
