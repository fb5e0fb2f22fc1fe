"""What `stoker pack` reads: image folders, file groups, LMDB, HDF5, or a Dataset factory.

A source is a sequence of samples, each a key and its ``(ext, bytes)`` members, plus metadata
for the index. Sources are created in the main process and inherited by forked pack workers;
LMDB and HDF5 handles are opened lazily per process.
"""

from __future__ import annotations

import importlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

import numpy as np

from stoker.shards._encode import IMAGE_EXTS, encode_value, last_ext
from stoker.shards._errors import ShardArgumentError, ShardError
from stoker.shards._files import SourceTree, file_kind
from stoker.shards._limits import MAX_SAMPLE_BYTES
from stoker.shards._tar import split_name

__all__ = ["Source", "SourceFormat", "open_source"]

SourceFormat = Literal["auto", "imagefolder", "files", "lmdb", "hdf5", "factory"]
SOURCE_FORMATS: tuple[str, ...] = get_args(SourceFormat)
Members = list[tuple[str, bytes]]
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_KNOWN_EXTS = IMAGE_EXTS | {"cls", "cls2", "index", "id", "txt", "text", "json", "npy", "pth"}


class Source(Protocol):
    """A packable sequence of samples."""

    @property
    def description(self) -> str:
        """Identifies the source in the pack state (a resumed pack must match it)."""
        ...

    @property
    def meta(self) -> Mapping[str, Any]:
        """Stored in the index's ``meta``."""
        ...

    def __len__(self) -> int: ...

    def sample(self, index: int) -> tuple[str, Members]:
        """The key and ``(ext, bytes)`` members of sample ``index``."""
        ...


def _index_key(index: int, total: int) -> str:
    return f"{index:0{max(8, len(str(max(total - 1, 0))))}d}"


def _visible(name: str) -> bool:
    return not name.startswith(".")


def _is_image(name: str) -> bool:
    return _visible(name) and "." in name and name.rsplit(".", 1)[-1].lower() in IMAGE_EXTS


def _has_ext(name: str) -> bool:
    return _visible(name) and split_name(name) is not None


def _none_found(root: Path, what: str, tree: SourceTree) -> ShardArgumentError:
    links = sum("symbolic link" in why for _, why in tree.skipped)
    hint = f" ({links} symbolic links were skipped: `--follow-links` follows them)" if links else ""
    return ShardArgumentError(f"{root}: {what}{hint}.")


class ImageFolderSource:
    """``root/<class>/**/<image>``: labels are the sorted sub-folder names (torchvision's rule).

    Only regular files inside ``root`` are packed (see :class:`SourceTree`); ``skipped`` names
    the entries left out.
    """

    def __init__(self, root: Path, *, follow_links: bool = False) -> None:
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and _visible(e.name))
        tree = SourceTree(root, follow_links=follow_links)
        self.tree = tree
        self.files: list[tuple[str, str, int]] = [
            (walked, real, label)
            for label, found in enumerate(tree.files(self.classes, want=_is_image))
            for walked, real in found
        ]
        self.skipped = tree.skipped
        if not self.files:
            raise _none_found(
                root,
                f"no images found under its sub-folders ({', '.join(sorted(IMAGE_EXTS))})",
                tree,
            )
        self.description = f"imagefolder:{root}"
        self.meta = {"classes": self.classes, "source": "imagefolder"}

    def __len__(self) -> int:
        return len(self.files)

    def sample(self, index: int) -> tuple[str, Members]:
        walked, real, label = self.files[index]
        ext = walked.rsplit(".", 1)[-1].lower()
        ext = "jpg" if ext == "jpeg" else ext
        with self.tree.open(real) as f:
            data = f.read()
        return _index_key(index, len(self.files)), [("cls", str(label).encode()), (ext, data)]


class FileGroupSource:
    """A directory tree of files grouped by stem: ``a.jpg a.json b.jpg b.json`` -> samples a, b.

    Only regular files inside ``root`` are packed (see :class:`SourceTree`); ``skipped`` names
    the entries left out.
    """

    def __init__(self, root: Path, *, follow_links: bool = False) -> None:
        tree = SourceTree(root, follow_links=follow_links)
        self.tree = tree
        groups: dict[str, list[tuple[str, str]]] = {}
        for walked, real in tree.files(want=_has_ext, hidden_folders=False)[0]:
            key, ext = split_name(walked) or ("", "")
            groups.setdefault(key, []).append((ext, real))
        self.skipped = tree.skipped
        if not groups:
            raise _none_found(root, "no files with an extension to pack", tree)
        self.groups = sorted(groups.items())
        self.description = f"files:{root}"
        self.meta = {"source": "files"}

    def __len__(self) -> int:
        return len(self.groups)

    def sample(self, index: int) -> tuple[str, Members]:
        key, files = self.groups[index]
        members = []
        for ext, real in sorted(files):
            with self.tree.open(real) as f:
                members.append((ext, f.read()))
        return key, members


class LMDBSource:
    """An LMDB environment laid out as :class:`stoker.LMDBDataset` reads it.

    Its limits are the dataset's: keys that would be unsafe member names are refused, and so
    is a sample over ``max_sample_bytes`` (default 256 MiB).
    """

    def __init__(self, path: Path, *, max_sample_bytes: int | None = MAX_SAMPLE_BYTES) -> None:
        from stoker.shards._kv import LMDBDataset

        self.dataset = LMDBDataset(path, decode="bytes", max_sample_bytes=max_sample_bytes)
        self.description = f"lmdb:{path}"
        self.meta = {"source": "lmdb"}

    def __len__(self) -> int:
        return len(self.dataset)

    def sample(self, index: int) -> tuple[str, Members]:
        raw = self.dataset.raw(index)
        return raw.pop("__key__"), sorted(raw.items())


def _hdf5_ext(name: str, value: Any, is_string: bool) -> str:
    base = re.sub(r"[./]", "_", name)
    if base.lower() in _KNOWN_EXTS:
        return base.lower()
    if isinstance(value, bytes) and not is_string:
        if value[:3] == b"\xff\xd8\xff":
            return f"{base}.jpg"
        if value[:8] == b"\x89PNG\r\n\x1a\n":
            return f"{base}.png"
        return f"{base}.bin"
    if isinstance(value, str | bytes):
        return f"{base}.txt"
    if isinstance(value, np.integer | int | np.bool_):
        return f"{base}.cls"
    return f"{base}.npy"


class HDF5Source:
    """An HDF5 file: row ``i`` of every dataset (or of ``fields``) is sample ``i``.

    A dataset named like an extension (``jpg``, ``cls``, ``npy``...) keeps that name; others
    get one by their contents: ``name.jpg``/``name.png`` for encoded images, ``name.bin`` for
    other bytes, ``name.txt`` for strings, ``name.cls`` for integer scalars, ``name.npy`` else.

    Its limits are the dataset's: datasets whose bytes live outside the file are refused
    unless ``allow_external``, and rows over ``max_sample_bytes`` (default 256 MiB).
    """

    def __init__(
        self,
        path: Path,
        fields: Sequence[str] | None,
        *,
        allow_external: bool = False,
        max_sample_bytes: int | None = MAX_SAMPLE_BYTES,
    ) -> None:
        from stoker.shards._kv import HDF5Dataset

        self.dataset = HDF5Dataset(
            path, fields=fields, allow_external=allow_external, max_sample_bytes=max_sample_bytes
        )
        self.description = f"hdf5:{path}"
        self.meta = {"source": "hdf5", "fields": list(self.dataset.fields)}
        self._exts: list[str] | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def sample(self, index: int) -> tuple[str, Members]:
        row = self.dataset.row(index)
        if self._exts is None:
            first = self.dataset.row(0) if index else row
            self._exts = [_hdf5_ext(n, v, isinstance(v, str)) for n, v in first.items()]
        members = [
            (ext, encode_value(ext, v)) for ext, v in zip(self._exts, row.values(), strict=True)
        ]
        return _index_key(index, len(self)), sorted(members)


class FactorySource:
    """``module:factory``: a callable returning a map-style Dataset whose samples are dicts
    keyed by extension (``{"jpg": image, "cls": 3}``) or tuples named by ``fields``."""

    def __init__(self, spec: str, fields: Sequence[str] | None) -> None:
        module_name, attr = spec.split(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ShardError(
                f"cannot load factory {spec!r}: {exc}. Is its module on PYTHONPATH?"
            ) from exc
        self.dataset = factory()
        if not hasattr(self.dataset, "__len__") or not hasattr(self.dataset, "__getitem__"):
            raise ShardError(
                f"{spec} returned a {type(self.dataset).__name__}, not a map-style Dataset "
                "(with `__len__` and `__getitem__`)."
            )
        self.fields = tuple(fields) if fields is not None else None
        self.description = f"factory:{spec}"
        self.meta = {"source": "factory", "factory": spec}

    def __len__(self) -> int:
        return len(self.dataset)

    def sample(self, index: int) -> tuple[str, Members]:
        item = self.dataset[index]
        if isinstance(item, Mapping):
            pairs = [(str(k), v) for k, v in item.items() if not str(k).startswith("__")]
        elif isinstance(item, tuple | list) and self.fields is not None:
            if len(item) != len(self.fields):
                raise ShardError(
                    f"sample {index} has {len(item)} parts but `fields` names "
                    f"{len(self.fields)}: {self.fields}."
                )
            pairs = list(zip(self.fields, item, strict=True))
        else:
            raise ShardError(
                f"sample {index} of {self.description} is a {type(item).__name__}; return a dict "
                "keyed by extension ({'jpg': image, 'cls': 3}) or name the parts of a tuple with "
                "`--fields jpg,cls`."
            )
        members = []
        for ext, value in pairs:
            try:
                members.append((ext, encode_value(ext, value)))
            except TypeError as exc:
                raise ShardError(f"sample {index}: {exc}") from exc
        return _index_key(index, len(self)), sorted(members)


def _is_lmdb(path: Path) -> bool:
    return (path.is_dir() and (path / "data.mdb").exists()) or (
        path.is_file() and path.suffix in (".mdb", ".lmdb")
    )


def open_source(
    spec: str | os.PathLike[str],
    *,
    fmt: SourceFormat = "auto",
    fields: Sequence[str] | None = None,
    follow_links: bool = False,
) -> Source:
    """Open what `stoker pack` was pointed at.

    Args:
        spec: a path (image folder, directory of files, LMDB environment, HDF5 file) or
            ``module:factory``.
        fmt: force the kind of source instead of guessing it. Default ``"auto"``.
        fields: HDF5 datasets to pack, or extensions naming the parts of tuple samples.
        follow_links: in a folder, follow symbolic links to targets inside it (see
            :class:`SourceTree`). Default ``False``.

    Returns:
        The source.

    Raises:
        ShardArgumentError: if the source does not exist, is not a file or folder, cannot
            be guessed, or (a folder) holds nothing to pack.
        ShardError: if the source cannot be read.
    """
    if fmt not in SOURCE_FORMATS:
        raise ShardArgumentError(
            f"`format` must be one of {', '.join(SOURCE_FORMATS)}. Found: {fmt!r}."
        )
    text = os.fspath(spec)
    path = Path(text)
    if fmt == "factory" or (fmt == "auto" and not path.exists() and _FACTORY_RE.match(text)):
        return FactorySource(text, fields)
    if not path.exists():
        raise ShardArgumentError(
            f"source {text!r} does not exist (give a directory, an LMDB or HDF5 file, "
            "or `module:factory`)."
        )
    mode = path.stat().st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise ShardArgumentError(
            f"source {text!r} is {file_kind(mode)}, not a file or folder: give a directory, "
            "an LMDB or HDF5 file, or `module:factory`."
        )
    if fmt == "lmdb" or (fmt == "auto" and _is_lmdb(path)):
        return LMDBSource(path)
    if fmt == "hdf5" or (
        fmt == "auto" and path.is_file() and last_ext(path.name) in ("h5", "hdf5", "hdf", "he5")
    ):
        return HDF5Source(path, fields)
    if not path.is_dir():
        raise ShardArgumentError(
            f"cannot tell what {text!r} holds; pass `--format` ({', '.join(SOURCE_FORMATS[1:])})."
        )
    if fmt == "imagefolder":
        return ImageFolderSource(path, follow_links=follow_links)
    if fmt == "files":
        return FileGroupSource(path, follow_links=follow_links)
    top = [e for e in os.scandir(path) if _visible(e.name)]
    if top and all(e.is_dir() for e in top):
        return ImageFolderSource(path, follow_links=follow_links)
    return FileGroupSource(path, follow_links=follow_links)
