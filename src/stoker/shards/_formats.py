"""Parsers held to the one format an extension names and to sizes their bytes justify:
images, ``.npy`` arrays and torch.save archives, as decoded from a dataset's members.

Pillow picks a parser from a file's first bytes, among some forty (EPS hands PostScript to
Ghostscript); here the extension picks exactly one and the bytes must match it. Pillow's own
decompression-bomb check reads a process-wide setting and only warns below twice it, so the
pixel limit is applied here, from the header, before any pixel is decoded.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from stoker.errors import ConfigError
from stoker.shards._errors import ShardError
from stoker.shards._limits import format_bytes

__all__ = [
    "IMAGE_FORMATS",
    "PICKLE_EXTS",
    "SAFE_TORCH_LOAD",
    "ImageMode",
    "decode_image",
    "load_npy",
    "load_torch",
    "require_safe_torch",
    "torch_load_is_safe",
]

ImageMode = Literal["pil", "numpy", "torch"]

#: The one Pillow format each image extension is parsed as (the keys are ``IMAGE_EXTS``).
IMAGE_FORMATS: Mapping[str, str] = MappingProxyType(
    {
        "jpg": "JPEG",
        "jpeg": "JPEG",
        "png": "PNG",
        "ppm": "PPM",
        "pgm": "PPM",
        "pbm": "PPM",
        "pnm": "PPM",
        "bmp": "BMP",
        "tif": "TIFF",
        "tiff": "TIFF",
        "webp": "WEBP",
    }
)
#: Extensions whose bytes are pickles: bytes unless a ``decode`` mapping names them.
PICKLE_EXTS = frozenset({"pth", "pt", "pickle", "pkl", "pyd"})
#: The first torch whose ``torch.load(weights_only=True)`` stoker trusts with a dataset's
#: bytes: 2.6 fixed code execution through it (CVE-2025-32434), 2.10 memory corruption in its
#: unpickler (CVE-2026-24747).
SAFE_TORCH_LOAD = "2.10"


def torch_load_is_safe(version: str) -> bool:
    """Whether torch ``version`` is at least :data:`SAFE_TORCH_LOAD` (pre-releases of it are
    not)."""
    from torch.torch_version import TorchVersion

    return bool(TorchVersion(version) >= SAFE_TORCH_LOAD)


def require_safe_torch(ext: str) -> None:
    """Refuse to unpickle field ``ext`` on a torch older than :data:`SAFE_TORCH_LOAD`.

    Raises:
        ConfigError: naming the version found, the CVEs and the fix.
    """
    import torch

    if not torch_load_is_safe(torch.__version__):
        raise ConfigError(
            f"decoding pickled field {ext!r} needs torch >= {SAFE_TORCH_LOAD}: older versions of "
            "torch.load(weights_only=True) can be made to run code (CVE-2025-32434) or corrupt "
            f"memory (CVE-2026-24747). Found: torch {torch.__version__}. Upgrade torch, or leave "
            f"{ext!r} out of `decode` to get its bytes."
        )


def decode_image(data: Any, kind: str, mode: ImageMode, max_pixels: int | None, where: str) -> Any:
    """Member bytes as an image, parsed only as ``IMAGE_FORMATS[kind]``.

    Raises:
        ShardError: if the bytes are not of that format, or declare more than ``max_pixels``.
    """
    from PIL import Image

    fmt = IMAGE_FORMATS[kind]
    # Image.open(fp, formats=[fmt]) without its pixel check, which reads Pillow's process-wide
    # MAX_IMAGE_PIXELS (a warning below twice that, an error above): stoker applies its own.
    if fmt not in Image.OPEN:
        Image.init()  # Pillow registers TIFF and WEBP on first use
    factory, accept = Image.OPEN[fmt]
    head = bytes(data[:16])
    verdict = accept(head) if accept is not None else True
    if not verdict or isinstance(verdict, str):
        raise ShardError(
            f"{where} is not a {fmt} image (its bytes start {head!r}): stoker parses a member "
            "only as the format its extension names. Name the field for what it holds, or "
            f"decode it with a function of yours: `decode={{{kind!r}: fn}}`."
        )
    image = factory(io.BytesIO(data), "")  # parses the header only
    width, height = image.size
    if max_pixels is not None and width * height > max_pixels:
        raise ShardError(
            f"{where} is a {width}x{height} {fmt} image ({width * height:,} pixels), over the "
            f"limit of {max_pixels:,} (`max_image_pixels`; the default is Pillow's "
            "decompression-bomb threshold): if you trust this data, pass a larger "
            "`max_image_pixels` (or None for no limit)."
        )
    image.load()
    if mode == "pil":
        return image
    array = np.array(image.convert("RGB") if image.mode not in ("RGB", "L") else image)
    if mode == "numpy":
        return array
    import torch

    tensor = torch.from_numpy(array)
    return tensor.unsqueeze(0) if tensor.ndim == 2 else tensor.permute(2, 0, 1).contiguous()


def load_npy(data: Any, where: str) -> Any:
    """An ``.npy`` member whose header declares no more than the bytes after it
    (``allow_pickle=False``).

    Raises:
        ShardError: if the header declares more.
    """
    fp = io.BytesIO(data)
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
    declared, present = math.prod(shape) * dtype.itemsize, len(fp.getbuffer()) - fp.tell()
    if declared > present:  # numpy would allocate the declared size before reading
        raise ShardError(
            f"{where}: its .npy header declares a {dtype} array of shape {shape} "
            f"({format_bytes(declared)}) but only {present} bytes follow."
        )
    fp.seek(0)
    return np.load(fp, allow_pickle=False)


def load_torch(data: Any, kind: str, where: str) -> Any:
    """A torch.save archive of uncompressed entries, by ``torch.load(weights_only=True)``.

    Raises:
        ConfigError: on a torch older than :data:`SAFE_TORCH_LOAD`.
        ShardError: if the bytes are not such an archive.
    """
    require_safe_torch(kind)
    try:
        entries = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except zipfile.BadZipFile:
        raise ShardError(
            f"{where} is not a torch.save archive (a zip file, torch.save's format since torch "
            "1.6), and stoker unpickles nothing else. If you trust it, decode it with a "
            f"function of yours: `decode={{{kind!r}: fn}}`."
        ) from None
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED or entry.file_size > len(data):
            raise ShardError(
                f"{where}: entry {entry.filename!r} of its torch.save archive declares "
                f"{format_bytes(entry.file_size)} from {format_bytes(entry.compress_size)} "
                "compressed; torch.save stores entries as they are, so this one is refused."
            )
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
