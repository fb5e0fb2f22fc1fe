"""Member bytes to Python values: images, numpy, json, text, class labels, or a callable.

A sample is a dict ``{"__key__": str, ext: bytes-like, ...}``. :func:`make_decoder` turns a
``decode=`` argument into a function applied to each sample; the extension's last part picks
the decoder (``"seg.png"`` is decoded as a PNG), as WebDataset does.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

import numpy as np

from stoker.errors import ConfigError
from stoker.shards._encode import IMAGE_EXTS, last_ext

__all__ = ["Decode", "ImageMode", "decode_field", "decode_sample", "make_decoder", "select_fields"]

ImageMode = Literal["pil", "numpy", "torch"]
_IMAGE_MODES: tuple[str, ...] = get_args(ImageMode)
Sample = dict[str, Any]
# None: zero-copy memoryviews; "bytes": copies; an ImageMode: decode every known field, images
# into that type; a callable: called with the raw sample; a mapping: ext -> callable(bytes).
Decode = (
    None
    | Literal["bytes", "pil", "numpy", "torch"]
    | Callable[[Sample], Any]
    | Mapping[str, Callable[[Any], Any]]
)


def _image(data: Any, mode: ImageMode) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.load()
    if mode == "pil":
        return image
    array = np.array(image.convert("RGB") if image.mode not in ("RGB", "L") else image)
    if mode == "numpy":
        return array
    import torch

    tensor = torch.from_numpy(array)
    return tensor.unsqueeze(0) if tensor.ndim == 2 else tensor.permute(2, 0, 1).contiguous()


def decode_field(ext: str, data: Any, *, image: ImageMode = "pil") -> Any:
    """Decode one member's bytes by its extension.

    Args:
        ext: the member's extension; its last part picks the decoder.
        data: the bytes (``bytes`` or a ``memoryview``).
        image: what images become: ``"pil"`` (default) a ``PIL.Image``, ``"numpy"`` an HWC
            ``uint8`` array, ``"torch"`` a CHW ``uint8`` tensor.

    Returns:
        ``int`` for ``cls``/``cls2``/``index``/``id``, ``str`` for ``txt``/``text``, the object
        for ``json``, an array for ``npy`` (``allow_pickle=False``), the object for ``pth``
        (``weights_only=True``), an image for image extensions; ``bytes`` for anything else
        (pickles are never unpickled implicitly).
    """
    kind = last_ext(ext)
    if kind in ("cls", "cls2", "index", "id"):
        return int(bytes(data))
    if kind in ("txt", "text"):
        return bytes(data).decode("utf-8")
    if kind == "json":
        return json.loads(bytes(data))
    if kind == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    if kind == "pth":
        import torch

        return torch.load(io.BytesIO(data), weights_only=True)
    if kind in IMAGE_EXTS:
        return _image(data, image)
    return bytes(data)


def decode_sample(sample: Mapping[str, Any], *, image: ImageMode = "pil") -> Sample:
    """Decode every field of a sample (keys starting with ``__`` pass through).

    Args:
        sample: ``{"__key__": ..., ext: bytes-like, ...}``.
        image: see :func:`decode_field`. Default ``"pil"``.

    Returns:
        A new dict with decoded values.
    """
    return {
        k: v if k.startswith("__") else decode_field(k, v, image=image) for k, v in sample.items()
    }


def _copy(sample: Mapping[str, Any]) -> Sample:
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def make_decoder(decode: Decode) -> Callable[[Sample], Any] | None:
    """Turn a ``decode=`` argument into a per-sample function.

    Args:
        decode: ``None`` (zero-copy memoryviews: no function), ``"bytes"``, ``"pil"``,
            ``"numpy"``, ``"torch"``, a callable taking the raw sample, or a mapping from
            extension (last part) to a callable taking the member's bytes; extensions the
            mapping does not name are decoded by :func:`decode_field` with PIL images.

    Returns:
        The function, or ``None`` for raw samples.

    Raises:
        ConfigError: for any other value.
    """
    if decode is None:
        return None
    if decode == "bytes":
        return _copy
    if isinstance(decode, str) and decode in _IMAGE_MODES:
        mode: ImageMode = decode
        return _ImageDecoder(mode)
    if isinstance(decode, Mapping):
        return _MappingDecoder(dict(decode))
    if callable(decode):
        return decode
    raise ConfigError(
        "`decode` must be None, 'bytes', 'pil', 'numpy', 'torch', a callable or a mapping from "
        f"extension to callable. Found: {decode!r}."
    )


class _ImageDecoder:
    # A class, not a closure, so that datasets holding it pickle for spawn workers.
    def __init__(self, mode: ImageMode) -> None:
        self.mode = mode

    def __call__(self, sample: Sample) -> Sample:
        return decode_sample(sample, image=self.mode)


class _MappingDecoder:
    def __init__(self, table: dict[str, Callable[[Any], Any]]) -> None:
        self.table = table

    def __call__(self, sample: Sample) -> Sample:
        out: Sample = {}
        for k, v in sample.items():
            fn = self.table.get(last_ext(k)) or self.table.get(k)
            if k.startswith("__"):
                out[k] = v
            else:
                out[k] = fn(v) if fn is not None else decode_field(k, v)
        return out


def select_fields(
    sample: Mapping[str, Any], fields: tuple[str, ...], where: str
) -> tuple[Any, ...]:
    """Pick fields in order; ``"jpg;png"`` takes whichever is present (WebDataset's ``to_tuple``).

    Raises:
        KeyError: naming the sample, the missing field and the fields it has.
    """
    out = []
    for spec in fields:
        for name in spec.split(";"):
            if name in sample:
                out.append(sample[name])
                break
        else:
            have = sorted(k for k in sample if not k.startswith("__"))
            raise KeyError(
                f"{where}: sample {sample.get('__key__')!r} has no field {spec!r} (it has "
                f"{have}); fix `fields`."
            )
    return tuple(out)
