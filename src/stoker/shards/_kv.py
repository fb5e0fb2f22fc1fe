"""LMDB and HDF5 files as map-style datasets, opened lazily in each process.

Neither an LMDB environment nor an HDF5 file handle survives a fork, so a handle is opened on
first access in each process (the owning pid is remembered) and dropped when the dataset is
pickled for a spawned worker. The main process reads only metadata (keys, lengths) and closes
its handle at once.

LMDB layout: records are read in key order; a key ``"{sample}.{ext}"`` is member ``ext`` of
sample ``sample`` (WebDataset's convention, so consecutive records form a sample), a key
without a dot is a one-member sample with extension ``bin``; keys starting with ``__`` (such
as ``__len__``) are metadata and skipped.

Both read files someone else may have made: an LMDB key that would be an unsafe file name is
refused, as are HDF5 datasets whose bytes live outside the file (see ``_hdf5_checks``), and a
sample over ``max_sample_bytes`` is refused before its bytes are copied.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data as tud

from stoker.shards._decode import Decode, make_decoder, select_fields
from stoker.shards._errors import ShardError
from stoker.shards._hdf5_checks import (
    check_path_links,
    check_row_bytes,
    check_storage,
    check_tree_links,
    is_variable_length,
)
from stoker.shards._limits import (
    MAX_IMAGE_PIXELS,
    MAX_SAMPLE_BYTES,
    check_limit_arg,
    check_sample_bytes,
)
from stoker.shards._tar import member_name_problem, split_name

__all__ = ["HDF5Dataset", "LMDBDataset", "hdf5_fields"]

LMDB_MAP_SIZE = 1 << 40
RAW_EXT = "bin"


def _group_lmdb_keys(
    keys: Sequence[bytes], where: str
) -> list[tuple[str, tuple[tuple[str, bytes], ...]]]:
    samples: list[tuple[str, list[tuple[str, bytes]]]] = []
    for raw in keys:
        text = raw.decode("utf-8", "surrogateescape")
        if text.startswith("__"):
            continue
        problem = member_name_problem(text)
        if problem is not None:
            raise ShardError(
                f"{where}: key {text!r} {problem}; as a member or file name it would point "
                "outside the folder it is unpacked to. Rename the key (keys are relative paths "
                "without '..')."
            )
        split = split_name(text)
        key, ext = split if split is not None else (text, RAW_EXT)
        if samples and samples[-1][0] == key:
            samples[-1][1].append((ext, raw))
        else:
            samples.append((key, [(ext, raw)]))
    return [(k, tuple(m)) for k, m in samples]


# py-lmdb refuses to open an environment twice in one process, and a forked child inherits the
# parent's registration. Environments are therefore shared per process and reference-counted;
# a child first closes what it inherited (read-only and lock-free, so closing there is safe).
_lmdb_envs: dict[str, list[Any]] = {}  # path -> [env, refcount, owner pid]


def _lmdb_acquire(path: str, subdir: bool) -> Any:
    import lmdb

    entry = _lmdb_envs.get(path)
    if entry is not None and entry[2] != os.getpid():
        entry[0].close()
        entry = None
    if entry is None:
        try:
            env = lmdb.open(
                path,
                subdir=subdir,
                readonly=True,
                lock=False,
                readahead=False,
                meminit=False,
                max_readers=2048,
            )
        except lmdb.Error as exc:
            raise ShardError(
                f"cannot open LMDB environment {path!r}: {exc} (close other handles to it in "
                "this process first)."
            ) from exc
        entry = _lmdb_envs[path] = [env, 0, os.getpid()]
    entry[1] += 1
    return entry[0]


def _lmdb_release(path: str) -> None:
    entry = _lmdb_envs.get(path)
    if entry is None or entry[2] != os.getpid():
        return
    entry[1] -= 1
    if entry[1] <= 0:
        entry[0].close()
        del _lmdb_envs[path]


class LMDBDataset(tud.Dataset[Any]):
    """Random access to the samples of an LMDB environment.

    Args:
        path: the environment (a directory holding ``data.mdb``, or the file itself).
        decode: how samples come out; see :func:`stoker.shards.make_decoder`. Default
            ``"bytes"`` (values are copied out of the transaction).
        fields: return a tuple of these fields instead of a dict (``"jpg;png"`` takes either).
            Default ``None``.
        transform: applied to each sample after decoding. Default ``None``.
        max_image_pixels: a sample whose images declare more pixels in all is refused before
            they are decoded. Default 89,478,485, Pillow's own threshold for one image
            (Pillow's process-wide setting is neither read nor changed); ``None`` for no limit.
        max_sample_bytes: a sample whose records take more bytes is refused before they are
            copied. Default 256 MiB; ``None`` for no limit.

    Raises:
        ShardError: if the environment cannot be opened, or a key would be an unsafe file name
            (absolute, with a ``..`` component or a NUL).
        ConfigError: for a bad ``decode`` or limit.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        decode: Decode = "bytes",
        fields: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
        max_sample_bytes: int | None = MAX_SAMPLE_BYTES,
    ) -> None:
        self.path = str(path)
        self._subdir = Path(path).is_dir()
        self._decode = make_decoder(
            "bytes" if decode is None else decode, max_image_pixels=max_image_pixels
        )
        self._max_bytes = check_limit_arg("max_sample_bytes", max_sample_bytes)
        self._fields = tuple(fields) if fields is not None else None
        self._transform = transform
        self._env: Any = None
        self._pid = -1
        env = self._open()
        try:
            with env.begin() as txn:
                keys = list(txn.cursor().iternext(keys=True, values=False))
        finally:
            _lmdb_release(self.path)
        self._samples = _group_lmdb_keys(keys, f"LMDB environment {self.path}")

    def _open(self) -> Any:
        return _lmdb_acquire(self.path, self._subdir)

    def _handle(self) -> Any:
        if self._env is None or self._pid != os.getpid():
            self._env, self._pid = self._open(), os.getpid()
        return self._env

    def __len__(self) -> int:
        return len(self._samples)

    def raw(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as ``{"__key__": key, ext: bytes, ...}`` without decoding.

        Raises:
            ShardError: if a record vanished, or the sample's records take more than
                ``max_sample_bytes``.
        """
        key, members = self._samples[index]
        sample: dict[str, Any] = {"__key__": key}
        # buffers=True: views into the map, so that sizes are checked before anything is copied.
        with self._handle().begin(buffers=True) as txn:
            views = []
            for ext, dbkey in members:
                view = txn.get(dbkey)
                if view is None:
                    raise ShardError(
                        f"{self.path}: record {dbkey!r} vanished since the dataset was opened"
                    )
                views.append((ext, view))
            sizes = {f"{key}.{ext}": len(view) for ext, view in views}
            check_sample_bytes(
                f"LMDB sample {key!r} of {self.path} ({sizes})",
                sum(sizes.values()),
                self._max_bytes,
            )
            for ext, view in views:
                sample[ext] = bytes(view)
        return sample

    def __getitem__(self, index: int) -> Any:
        sample: Any = self.raw(index)
        if self._decode is not None:
            sample = self._decode(sample)
        if self._fields is not None:
            sample = select_fields(sample, self._fields, self.path)
        return self._transform(sample) if self._transform is not None else sample

    def close(self) -> None:
        """Close this process's environment handle (it reopens on the next access)."""
        if self._env is not None and self._pid == os.getpid():
            _lmdb_release(self.path)
        self._env = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_env"], state["_pid"] = None, -1
        return state

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def hdf5_fields(file: Any, *, allow_external: bool = False) -> dict[str, Any]:
    """Every dataset of an open h5py file by path, provided they share a first dimension.

    Only datasets reached through the file's own groups are listed (soft and external links are
    not followed); unless ``allow_external``, a file holding any link into another file is
    refused.

    Raises:
        ShardError: if the datasets disagree on their length, or the file links elsewhere.
    """
    import h5py

    if not allow_external:
        check_tree_links(file)
    found: dict[str, Any] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and obj.shape:
            found[name] = obj

    file.visititems(visit)
    lengths = {name: ds.shape[0] for name, ds in found.items()}
    if len(set(lengths.values())) > 1:
        raise ShardError(
            f"{file.filename}: datasets have different lengths {lengths}; choose those that "
            "belong together with `fields`."
        )
    return found


def _value_bytes(value: Any) -> int:
    """Bytes a read value holds (variable-length rows: bytes, str, arrays of arrays)."""
    if isinstance(value, bytes | str):
        return len(value)
    if isinstance(value, np.ndarray) and value.dtype.kind == "O":
        return sum(_value_bytes(v) for v in value.flat)
    return int(getattr(value, "nbytes", 0))


class HDF5Dataset(tud.Dataset[Any]):
    """Random access to the rows of an HDF5 file: sample ``i`` is row ``i`` of each dataset.

    Args:
        path: the ``.h5``/``.hdf5`` file.
        fields: dataset paths to read, in order; a tuple of their rows is returned. Default
            ``None``: every dataset with a first dimension, as a dict ``{path: row}``.
        transform: applied to each sample. Default ``None``.
        allow_external: read datasets whose bytes live in other files (external storage,
            virtual datasets, external links). Default ``False``: such a file is refused, as
            one made by someone else could read your own files into its samples.
        max_sample_bytes: the most bytes one row (all fields) may take. Fixed-size rows, and
            the compressed chunks they are read from, are checked from metadata when the file
            is opened; variable-length values when read. Default 256 MiB; ``None`` for no
            limit.

    Rows come out as numpy arrays (scalars for 1-d datasets); variable-length ``uint8`` rows
    (encoded images) come out as ``bytes`` and strings as ``str``.

    Raises:
        ShardError: if the file cannot be opened, a field is missing or not a dataset, lengths
            disagree, a dataset's bytes live outside the file, or a row is over
            ``max_sample_bytes``.
        ConfigError: for a bad ``max_sample_bytes``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fields: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        allow_external: bool = False,
        max_sample_bytes: int | None = MAX_SAMPLE_BYTES,
    ) -> None:
        import h5py

        self.path = str(path)
        self._transform = transform
        self._as_tuple = fields is not None
        self._max_bytes = check_limit_arg("max_sample_bytes", max_sample_bytes)
        self._file: Any = None
        self._pid = -1
        with self._open() as f:
            available = hdf5_fields(f, allow_external=allow_external) if fields is None else {}
            if fields is not None:
                for name in fields:
                    if not allow_external:
                        check_path_links(f, name)  # before `in` or `[]` could follow one
                    obj = f.get(name)
                    if not isinstance(obj, h5py.Dataset):
                        found = "no" if obj is None else f"a {type(obj).__name__}, not a"
                        raise ShardError(
                            f"{self.path} has {found} dataset {name!r} (fix `fields`)."
                        )
                    available[name] = obj
                lengths = {n: ds.shape[0] for n, ds in available.items()}
                if len(set(lengths.values())) > 1:
                    raise ShardError(f"{self.path}: `fields` have different lengths {lengths}.")
            if not allow_external:
                for name, ds in available.items():
                    check_storage(f, name, ds)
            self._fixed_bytes = check_row_bytes(f, available, self._max_bytes)
            self._vlen = tuple(n for n, ds in available.items() if is_variable_length(ds))
            self.fields = tuple(available)
            self._len = next(iter(available.values())).shape[0] if available else 0

    def _open(self) -> Any:
        import h5py

        try:
            return h5py.File(self.path, "r")
        except OSError as exc:
            raise ShardError(f"cannot open HDF5 file {self.path!r}: {exc}") from exc

    def _handle(self) -> Any:
        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = self._open(), os.getpid()
        return self._file

    def __len__(self) -> int:
        return self._len

    def row(self, index: int) -> dict[str, Any]:
        """Row ``index`` of every field as ``{path: value}``.

        Raises:
            IndexError: if ``index`` is out of range.
            ShardError: if its variable-length values take the row over ``max_sample_bytes``.
        """
        if not -self._len <= index < self._len:
            raise IndexError(f"index {index} out of range for {self._len} rows of {self.path}")
        f = self._handle()
        out: dict[str, Any] = {}
        for name in self.fields:
            value: Any
            if name in self._vlen and f[name].ndim > 1 and self._max_bytes is not None:
                value = self._vlen_row(f[name], index, self._max_bytes)
            else:
                value = f[name][index]
            if (
                isinstance(value, np.ndarray)
                and value.dtype == np.uint8
                and f[name].dtype.kind == "O"
            ):
                value = value.tobytes()
            elif isinstance(value, bytes) and f[name].dtype.kind in ("O", "S"):
                value = value.decode("utf-8") if f[name].dtype.kind == "O" else value
            elif isinstance(value, np.void):
                value = value.tobytes()
            out[name] = value
        if self._vlen and self._max_bytes is not None:
            check_sample_bytes(
                f"{self.path}: row {index}",
                self._fixed_bytes + sum(_value_bytes(out[n]) for n in self._vlen),
                self._max_bytes,
            )
        return out

    def _vlen_row(self, dataset: Any, index: int, limit: int) -> np.ndarray:
        """A row of several variable-length values, read value by value against
        ``max_sample_bytes``: their descriptors may all point at one large heap object, so a
        2.4 MB file asked for 3.4 GiB in one read (each value's bytes are in the file)."""
        row = np.empty(dataset.shape[1:], dtype=object)
        total = self._fixed_bytes
        for position in np.ndindex(*row.shape):
            key = (index, *position)
            row[position] = value = dataset[key]
            total += _value_bytes(value)
            check_sample_bytes(f"{self.path}: row {index}", total, limit)
        return row

    def __getitem__(self, index: int) -> Any:
        row = self.row(index)
        sample: Any = tuple(row.values()) if self._as_tuple else row
        return self._transform(sample) if self._transform is not None else sample

    def close(self) -> None:
        """Close this process's file handle (it reopens on the next access)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_file"], state["_pid"] = None, -1
        return state

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
