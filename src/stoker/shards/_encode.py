"""Python values to member bytes, by WebDataset's extension conventions.

=====================  =================================================
extension (last part)  accepted values
=====================  =================================================
any                    ``bytes``, ``bytearray``, ``memoryview`` (stored as is)
``cls cls2 index id``  ``int`` (ASCII decimal)
``txt text``           ``str`` (UTF-8)
``json``               anything ``json.dumps`` accepts
``npy``                ``numpy.ndarray``, ``torch.Tensor``, numbers
``pth``                anything ``torch.save`` accepts
``jpg jpeg png ...``   ``PIL.Image.Image``, or an HWC ``uint8`` array/tensor
=====================  =================================================
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

__all__ = ["IMAGE_EXTS", "encode_value", "last_ext"]

IMAGE_EXTS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "tif", "tiff", "webp"}
)
_PIL_FORMATS = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "tif": "TIFF",
    "tiff": "TIFF",
    "pbm": "PPM",
    "pgm": "PPM",
    "pnm": "PPM",
    "ppm": "PPM",
}
JPEG_QUALITY = 95


def last_ext(ext: str) -> str:
    """The part of an extension that selects the encoding: ``"seg.png"`` -> ``"png"``."""
    return ext.rsplit(".", 1)[-1].lower()


def _array(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return np.asarray(value.detach().cpu().numpy())
    return np.asarray(value)


def encode_value(ext: str, value: Any) -> bytes:
    """Encode ``value`` for a member with extension ``ext``.

    Args:
        ext: the member's extension (its last part selects the encoding).
        value: the Python value.

    Returns:
        The member's bytes.

    Raises:
        TypeError: if ``value`` cannot be stored under ``ext``; the message names the types
            that can.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    kind = last_ext(ext)
    if kind in ("cls", "cls2", "index", "id") and isinstance(value, int | np.integer):
        return str(int(value)).encode()
    if kind in ("txt", "text") and isinstance(value, str):
        return value.encode("utf-8")
    if kind == "json":
        return json.dumps(value, sort_keys=True).encode("utf-8")
    if kind == "npy":
        buf = io.BytesIO()
        np.save(buf, _array(value), allow_pickle=False)
        return buf.getvalue()
    if kind == "pth":
        import torch

        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
    if kind in IMAGE_EXTS:
        from PIL import Image

        image = value
        if not isinstance(image, Image.Image):
            array = _array(value)
            if array.dtype != np.uint8 or array.ndim not in (2, 3):
                raise TypeError(
                    f"field {ext!r} needs a PIL image or an HWC uint8 array; found an array of "
                    f"dtype {array.dtype} and shape {array.shape}."
                )
            image = Image.fromarray(array)
        buf = io.BytesIO()
        fmt = _PIL_FORMATS.get(kind, kind.upper())
        options = {"quality": JPEG_QUALITY} if fmt == "JPEG" else {}
        if fmt == "JPEG" and image.mode not in ("RGB", "L", "CMYK"):
            image = image.convert("RGB")
        image.save(buf, format=fmt, **options)
        return buf.getvalue()
    if kind in ("txt", "text"):
        return str(value).encode("utf-8")
    raise TypeError(
        f"cannot store a {type(value).__name__} in field {ext!r}: give bytes, or name the field "
        "by what it holds (`.cls` int, `.txt` str, `.json` object, `.npy` array or tensor, "
        "`.pth` anything torch.save takes, `.jpg`/`.png` image)."
    )
