"""LMDB and HDF5 files as map-style datasets, opened lazily in each process.

Neither an LMDB environment nor an HDF5 file handle survives a fork, so a handle is opened on
first access in each process (the owning pid is remembered) and dropped when the dataset is
pickled for a spawned worker. The main process reads only metadata (keys, lengths) and closes
its handle at once.

LMDB layout: records are read in key order; a key ``"{sample}.{ext}"`` is member ``ext`` of
sample ``sample`` (WebDataset's convention, so consecutive records form a sample), a key
without a dot is a one-member sample with extension ``bin``; keys starting with ``__`` (such
as ``__len__``) are metadata and skipped.
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
from stoker.shards._tar import split_name

__all__ = ["HDF5Dataset", "LMDBDataset", "hdf5_fields"]

LMDB_MAP_SIZE = 1 << 40
RAW_EXT = "bin"


def _group_lmdb_keys(keys: Sequence[bytes]) -> list[tuple[str, tuple[tuple[str, bytes], ...]]]:
    samples: list[tuple[str, list[tuple[str, bytes]]]] = []
    for raw in keys:
        text = raw.decode("utf-8", "surrogateescape")
        if text.startswith("__"):
            continue
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

    Raises:
        ShardError: if the environment cannot be opened.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        decode: Decode = "bytes",
        fields: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.path = str(path)
        self._subdir = Path(path).is_dir()
        self._decode = make_decoder("bytes" if decode is None else decode)
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
        self._samples = _group_lmdb_keys(keys)

    def _open(self) -> Any:
        return _lmdb_acquire(self.path, self._subdir)

    def _handle(self) -> Any:
        if self._env is None or self._pid != os.getpid():
            self._env, self._pid = self._open(), os.getpid()
        return self._env

    def __len__(self) -> int:
        return len(self._samples)

    def raw(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as ``{"__key__": key, ext: bytes, ...}`` without decoding."""
        key, members = self._samples[index]
        sample: dict[str, Any] = {"__key__": key}
        with self._handle().begin() as txn:
            for ext, dbkey in members:
                value = txn.get(dbkey)
                if value is None:
                    raise ShardError(
                        f"{self.path}: record {dbkey!r} vanished since the dataset was opened"
                    )
                sample[ext] = value
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


def hdf5_fields(file: Any) -> dict[str, Any]:
    """Every dataset of an open h5py file by path, provided they share a first dimension.

    Raises:
        ShardError: if the datasets disagree on their length.
    """
    import h5py

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


class HDF5Dataset(tud.Dataset[Any]):
    """Random access to the rows of an HDF5 file: sample ``i`` is row ``i`` of each dataset.

    Args:
        path: the ``.h5``/``.hdf5`` file.
        fields: dataset paths to read, in order; a tuple of their rows is returned. Default
            ``None``: every dataset with a first dimension, as a dict ``{path: row}``.
        transform: applied to each sample. Default ``None``.

    Rows come out as numpy arrays (scalars for 1-d datasets); variable-length ``uint8`` rows
    (encoded images) come out as ``bytes`` and strings as ``str``.

    Raises:
        ShardError: if the file cannot be opened, a field is missing or lengths disagree.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fields: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.path = str(path)
        self._transform = transform
        self._as_tuple = fields is not None
        self._file: Any = None
        self._pid = -1
        with self._open() as f:
            available = hdf5_fields(f) if fields is None else {}
            if fields is not None:
                for name in fields:
                    if name not in f:
                        raise ShardError(f"{self.path} has no dataset {name!r} (fix `fields`).")
                    available[name] = f[name]
                lengths = {n: ds.shape[0] for n, ds in available.items()}
                if len(set(lengths.values())) > 1:
                    raise ShardError(f"{self.path}: `fields` have different lengths {lengths}.")
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
        """Row ``index`` of every field as ``{path: value}``."""
        if not -self._len <= index < self._len:
            raise IndexError(f"index {index} out of range for {self._len} rows of {self.path}")
        f = self._handle()
        out: dict[str, Any] = {}
        for name in self.fields:
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
        return out

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
