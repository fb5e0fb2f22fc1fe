"""Bounds on what a dataset's contents may cost: pixels and bytes.

A dataset made by someone else is data, not code: its members may declare sizes out of
proportion to their bytes (a 12 KB PNG of 10,000 x 10,000 pixels, a 1.4 KB HDF5 file with
1 GiB rows). The checks here run before anything is allocated, and fail with a
:class:`ShardError` that names the value, the limit and the knob that raises it.
"""

from __future__ import annotations

from stoker.errors import ConfigError
from stoker.shards._errors import ShardError

__all__ = [
    "MAX_IMAGE_PIXELS",
    "MAX_SAMPLE_BYTES",
    "check_limit_arg",
    "check_sample_bytes",
    "format_bytes",
]

#: Pillow's own default decompression-bomb threshold (``PIL.Image.MAX_IMAGE_PIXELS``:
#: 1 GiB / 4 bytes / 3), about 256 MiB of RGB. Stoker applies it itself, before decoding,
#: and never reads or changes Pillow's process-wide setting.
MAX_IMAGE_PIXELS = 1024 * 1024 * 1024 // 4 // 3
#: The most bytes one sample's values may take when read from HDF5 or LMDB: the same 256 MiB
#: budget as an image at the pixel limit.
MAX_SAMPLE_BYTES = 256 * 1024 * 1024


def format_bytes(n: int) -> str:
    """``n`` bytes for a message: ``"1.0 GiB"``, ``"300 B"``."""
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def check_limit_arg(name: str, value: object) -> int | None:
    """Validate a limit argument (``max_image_pixels``, ``max_sample_bytes``).

    Returns:
        ``value``: an int >= 1, or ``None`` for no limit.

    Raises:
        ConfigError: for anything else.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigError(f"`{name}` must be an int >= 1, or None for no limit. Found: {value!r}.")


def check_sample_bytes(what: str, size: int, limit: int | None) -> None:
    """Refuse ``size`` bytes over ``limit`` (``max_sample_bytes``) before they are read.

    Args:
        what: names the value (``"LMDB record 'a.jpg' of /data/db"``).
        size: the bytes the value declares.
        limit: the limit, or ``None`` for none.

    Raises:
        ShardError: naming the value, its size, the limit and the knob.
    """
    if limit is not None and size > limit:
        raise ShardError(
            f"{what} takes {format_bytes(size)} ({size} bytes), over the limit of "
            f"{format_bytes(limit)} (`max_sample_bytes`): if you trust this data, pass a larger "
            "`max_sample_bytes` (or None for no limit)."
        )
