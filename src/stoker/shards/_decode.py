"""Member bytes to Python values: images, numpy, json, text, class labels, or a callable.

A sample is a dict ``{"__key__": str, ext: bytes-like, ...}``. :func:`make_decoder` turns a
``decode=`` argument into a function applied to each sample; the extension's last part picks
the decoder (``"seg.png"`` is decoded as a PNG), as WebDataset does.

Members may come from a dataset someone else made, so an extension is an allow-list, not a
hint: a ``.jpg`` is parsed by Pillow's JPEG plugin and by nothing else (a ``.jpg`` holding
PostScript never reaches Ghostscript; a ``.png`` holding a JPEG is an error, not a JPEG), an
image declaring more than ``max_image_pixels`` (with the sample's other images, for a whole
sample) is refused from its header, an ``.npy`` header
must match the bytes that follow it, and pickled members (``pth pt pickle pkl pyd``) stay
bytes unless a ``decode`` mapping names their extension. Whatever a built-in decoder raises on
bad bytes comes out as a :class:`ShardError` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from stoker.errors import ConfigError
from stoker.shards._encode import last_ext
from stoker.shards._errors import ShardError
from stoker.shards._formats import (
    IMAGE_FORMATS,
    PICKLE_EXTS,
    ImageMode,
    decode_image,
    load_npy,
    load_torch,
    require_safe_torch,
)
from stoker.shards._limits import MAX_IMAGE_PIXELS, check_limit_arg

__all__ = ["Decode", "ImageMode", "decode_field", "decode_sample", "make_decoder", "select_fields"]

_IMAGE_MODES: tuple[str, ...] = get_args(ImageMode)
Sample = dict[str, Any]
# None: zero-copy memoryviews; "bytes": copies; an ImageMode: decode every known field, images
# into that type; a callable: called with the raw sample; a mapping: ext -> callable(bytes), or
# ext -> ImageMode for stoker's own decoder of that extension (the way to unpickle `pth`).
Decode = (
    None
    | Literal["bytes", "pil", "numpy", "torch"]
    | Callable[[Sample], Any]
    | Mapping[str, Callable[[Any], Any] | ImageMode]
)

_LABELS = ("cls", "cls2", "index", "id")
_TEXTS = ("txt", "text")


def _what(kind: str) -> str:
    if kind in _LABELS:
        return "an integer label"
    if kind in _TEXTS:
        return "UTF-8 text"
    if kind in PICKLE_EXTS:
        return "a torch.save archive"
    if kind in IMAGE_FORMATS:
        return f"a {IMAGE_FORMATS[kind]} image"
    return kind


def _decode(
    ext: str,
    data: Any,
    *,
    image: ImageMode,
    max_pixels: int | None,
    pickles: bool,
    where: str,
) -> Any:
    kind = last_ext(ext)
    try:
        if kind in _LABELS:
            return int(bytes(data))
        if kind in _TEXTS:
            return bytes(data).decode("utf-8")
        if kind == "json":
            return json.loads(bytes(data))
        if kind == "npy":
            return load_npy(data, where)
        if kind in PICKLE_EXTS:
            return load_torch(data, kind, where) if pickles else bytes(data)
        if kind in IMAGE_FORMATS:
            return decode_image(data, kind, image, max_pixels, where)
        return bytes(data)
    except (ShardError, ConfigError):
        raise
    except Exception as exc:  # a parser's complaint about the bytes, whatever its type
        size = f" ({len(data)} bytes)" if hasattr(data, "__len__") else ""
        raise ShardError(
            f"{where}{size} cannot be decoded as {_what(kind)}: {type(exc).__name__}: {exc}"
        ) from exc


def decode_field(
    ext: str,
    data: Any,
    *,
    image: ImageMode = "pil",
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
) -> Any:
    """Decode one member's bytes by its extension, and only as the format it names.

    Args:
        ext: the member's extension; its last part picks the decoder.
        data: the bytes (``bytes`` or a ``memoryview``).
        image: what images become: ``"pil"`` (default) a ``PIL.Image``, ``"numpy"`` an HWC
            ``uint8`` array, ``"torch"`` a CHW ``uint8`` tensor.
        max_image_pixels: images declaring more pixels are refused before decoding. Default
            89,478,485, Pillow's own threshold (Pillow's process-wide setting is neither read
            nor changed); ``None`` for no limit.

    Returns:
        ``int`` for ``cls``/``cls2``/``index``/``id``, ``str`` for ``txt``/``text``, the object
        for ``json``, an array for ``npy`` (``allow_pickle=False``), an image for ``jpg jpeg
        png ppm pgm pbm pnm bmp tif tiff webp``; ``bytes`` for anything else, pickles included
        (``pth pt pickle pkl pyd`` are decoded only when a ``decode`` mapping names them).

    Raises:
        ShardError: if the bytes are not what the extension names (an image of another
            format included), or an image is over ``max_image_pixels``.
    """
    check_limit_arg("max_image_pixels", max_image_pixels)
    return _decode(
        ext,
        data,
        image=image,
        max_pixels=max_image_pixels,
        pickles=False,
        where=f"field {ext!r}",
    )


def decode_sample(
    sample: Mapping[str, Any],
    *,
    image: ImageMode = "pil",
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
) -> Sample:
    """Decode every field of a sample (keys starting with ``__`` pass through).

    Args:
        sample: ``{"__key__": ..., ext: bytes-like, ...}``.
        image: see :func:`decode_field`. Default ``"pil"``.
        max_image_pixels: see :func:`decode_field`. Default 89,478,485.

    Returns:
        A new dict with decoded values.

    Raises:
        ShardError: as :func:`decode_field`, naming the sample's key.
    """
    check_limit_arg("max_image_pixels", max_image_pixels)
    return _ImageDecoder(image, max_image_pixels)(sample)


def _copy(sample: Mapping[str, Any]) -> Sample:
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def make_decoder(
    decode: Decode, *, max_image_pixels: int | None = MAX_IMAGE_PIXELS
) -> Callable[[Sample], Any] | None:
    """Turn a ``decode=`` argument into a per-sample function.

    Args:
        decode: ``None`` (zero-copy memoryviews: no function), ``"bytes"``, ``"pil"``,
            ``"numpy"``, ``"torch"``, a callable taking the raw sample, or a mapping from
            extension (last part) to a callable taking the member's bytes or to ``"pil"``,
            ``"numpy"`` or ``"torch"`` (stoker's own decoder for that extension, images into
            that type); extensions the mapping does not name are decoded by
            :func:`decode_field` with PIL images. Pickled extensions (``pth pt pickle pkl
            pyd``) are unpickled only when the mapping names them with a mode, and then only
            as torch.save archives, by ``torch.load(weights_only=True, map_location="cpu")``.
        max_image_pixels: see :func:`decode_field`; applies to stoker's own decoders. Default
            89,478,485.

    Returns:
        The function, or ``None`` for raw samples.

    Raises:
        ConfigError: for any other value, or a mapping that asks to unpickle on a torch older
            than ``stoker.shards._formats.SAFE_TORCH_LOAD`` (2.10).
    """
    max_pixels = check_limit_arg("max_image_pixels", max_image_pixels)
    if decode is None:
        return None
    if decode == "bytes":
        return _copy
    if isinstance(decode, str) and decode in _IMAGE_MODES:
        mode: ImageMode = decode
        return _ImageDecoder(mode, max_pixels)
    if isinstance(decode, Mapping):
        table = dict(decode)
        for ext, spec in table.items():
            if isinstance(spec, str) and spec in _IMAGE_MODES:
                if last_ext(ext) in PICKLE_EXTS:
                    require_safe_torch(ext)
            elif not callable(spec):
                raise ConfigError(
                    f"`decode[{ext!r}]` must be a callable taking the bytes, or 'pil', 'numpy' "
                    f"or 'torch' for stoker's own decoder. Found: {spec!r}."
                )
        return _MappingDecoder(table, max_pixels)
    if callable(decode):
        return decode
    raise ConfigError(
        "`decode` must be None, 'bytes', 'pil', 'numpy', 'torch', a callable or a mapping from "
        f"extension to callable. Found: {decode!r}."
    )


class _ImageDecoder:
    # A class, not a closure, so that datasets holding it pickle for spawn workers.
    def __init__(self, mode: ImageMode, max_pixels: int | None) -> None:
        self.mode = mode
        self.max_pixels = max_pixels

    def __call__(self, sample: Mapping[str, Any]) -> Sample:
        key = sample.get("__key__")
        budget = _PixelBudget(self.max_pixels)
        out: Sample = {}
        for k, v in sample.items():
            if k.startswith("__"):
                out[k] = v
                continue
            value = _decode(
                k,
                v,
                image=self.mode,
                max_pixels=budget.left,
                pickles=False,
                where=budget.where(key, k),
            )
            out[k] = budget.spent(k, value)
        return out


class _PixelBudget:
    """One ``max_image_pixels`` for all the images of a sample: sixty images each under the
    limit are as costly as one far over it (a 595 KB sample of PNGs decoded to 3.5 GB)."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit
        self.used = 0

    def where(self, key: object, field: str) -> str:
        shared = f" (after {self.used:,} pixels of the sample's other images)" if self.used else ""
        return f"sample {key!r} field {field!r}{shared}"

    def spent(self, field: str, value: Any) -> Any:
        """Count ``value`` (``field`` decoded within :attr:`left`) against the budget."""
        if last_ext(field) in IMAGE_FORMATS:
            pixels = _pixels(value)
            self.used += pixels
            if self.left is not None:
                self.left = max(0, self.left - pixels)
        return value


def _pixels(image: Any) -> int:
    """Pixels of a decoded image (a PIL image, an HWC array or a CHW tensor)."""
    size = getattr(image, "size", None)
    if isinstance(size, tuple) and len(size) == 2:  # PIL: (width, height)
        return int(size[0]) * int(size[1])
    shape = tuple(getattr(image, "shape", ()))
    if len(shape) == 3 and type(image).__module__.startswith("torch"):
        return int(shape[1]) * int(shape[2])
    if len(shape) >= 2:
        return int(shape[0]) * int(shape[1])
    return 0


class _MappingDecoder:
    def __init__(
        self, table: dict[str, Callable[[Any], Any] | ImageMode], max_pixels: int | None
    ) -> None:
        self.table = table
        self.max_pixels = max_pixels

    def __call__(self, sample: Sample) -> Sample:
        out: Sample = {}
        key = sample.get("__key__")
        budget = _PixelBudget(self.max_pixels)
        for k, v in sample.items():
            if k.startswith("__"):
                out[k] = v
                continue
            spec = self.table.get(last_ext(k)) or self.table.get(k)
            if spec is not None and not isinstance(spec, str):
                out[k] = spec(v)  # the user's own function: their limits
                continue
            value = _decode(
                k,
                v,
                image=spec or "pil",
                max_pixels=budget.left,
                pickles=spec is not None,
                where=budget.where(key, k),
            )
            out[k] = budget.spent(k, value)
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
