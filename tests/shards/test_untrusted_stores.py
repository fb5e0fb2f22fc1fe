"""HDF5 files and LMDB environments someone else made: reads stay inside the file, within a
byte budget per sample, and keys never become names that leave a folder."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from untrusted_inputs import (
    SECRET,
    hdf5_chunk_bomb,
    hdf5_reaching_out,
    hdf5_row_bomb,
    run_bounded,
    write_lmdb,
    write_secret,
)

from stoker.errors import ConfigError
from stoker.shards import HDF5Dataset, LMDBDataset, ShardDataset, ShardError, pack
from stoker.shards._hdf5_checks import MAX_SOFT_LINK_HOPS
from stoker.shards._sources import HDF5Source, LMDBSource


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize("how", ["external", "virtual", "link", "soft-to-link"])
def test_hdf5_bytes_outside_the_file_never_reach_samples_or_shards(tmp_path: Path, how: str):
    secret = write_secret(tmp_path / "home")
    data = hdf5_reaching_out(tmp_path / "dataset" / "data.h5", secret, how)
    out = tmp_path / "out"
    refusal = r"Stoker reads only what is inside the file.*`allow_external=True`"
    for fields in (None, ["x", "label"], ["x"]):
        with pytest.raises(ShardError, match=refusal):
            HDF5Dataset(data, fields=fields)
        with pytest.raises(ShardError, match=refusal):
            pack(HDF5Source(data, fields), out, shard_size=1 << 20, workers=1)
    assert not out.exists() or _files_holding(out, SECRET[:12]) == []

    # The same file, trusted: the secret does come through, so the refusal above is what kept
    # it out (a soft link or an external link is read only when named in `fields`).
    trusted = HDF5Dataset(data, fields=["x"], allow_external=True)
    assert trusted[0][0].tobytes() == SECRET


def test_hdf5_datasets_of_the_file_itself_are_read(tmp_path: Path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(12, dtype=np.uint8).reshape(3, 4)
        f["group/label"] = np.array([1, 2, 3])
        f["alias"] = h5py.SoftLink("/group/label")  # a soft link inside the file is fine
    ds = HDF5Dataset(path)
    assert ds.fields == ("group/label", "x") and ds[2]["x"].tolist() == [8, 9, 10, 11]
    assert HDF5Dataset(path, fields=["alias", "x"])[1][0] == 2


def test_hdf5_soft_link_loops_and_non_datasets_are_refused_with_a_shard_error(tmp_path: Path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
        f["loop"] = h5py.SoftLink("/loop2")
        f["loop2"] = h5py.SoftLink("/loop")
        f.create_group("group")
    with pytest.raises(ShardError, match=f"more than {MAX_SOFT_LINK_HOPS} soft links"):
        HDF5Dataset(path, fields=["loop"])
    with pytest.raises(ShardError, match="has a Group, not a dataset 'group'"):
        HDF5Dataset(path, fields=["group"])
    with pytest.raises(ShardError, match="has no dataset 'nothing'"):
        HDF5Dataset(path, fields=["nothing"])


def test_an_hdf5_row_bomb_is_refused_from_metadata_within_a_memory_budget(tmp_path: Path):
    path = hdf5_row_bomb(tmp_path / "bomb.h5")
    assert path.stat().st_size < 4096
    result = run_bounded("case_hdf5_row", path=str(path))
    assert result.get("raised") == "stoker.shards._errors.ShardError", result
    assert "one row of 'x' (1073741824,) uint8 takes 1.0 GiB" in result["message"]
    assert "`max_sample_bytes`" in result["message"]


def test_an_hdf5_compressed_chunk_bomb_is_refused_within_a_memory_budget(tmp_path: Path):
    path = hdf5_chunk_bomb(tmp_path / "bomb.h5")
    assert path.stat().st_size < 2 << 20
    result = run_bounded("case_hdf5_row", path=str(path))
    assert result.get("raised") == "stoker.shards._errors.ShardError", result
    assert "decompresses a whole chunk of shape (512, 1048576)" in result["message"]
    assert "takes 512.0 MiB" in result["message"]


def test_max_sample_bytes_bounds_hdf5_rows_fixed_and_variable(tmp_path: Path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((2, 100), dtype=np.float32)  # 400 bytes a row
        blobs = f.create_dataset("blob", (2,), dtype=h5py.vlen_dtype(np.uint8))
        blobs[0] = np.zeros(10, dtype=np.uint8)
        blobs[1] = np.zeros(5000, dtype=np.uint8)
    with pytest.raises(ShardError, match=r"one row of 'x' \(100,\) float32, .* takes 408 B"):
        HDF5Dataset(path, max_sample_bytes=300)
    ds = HDF5Dataset(path, max_sample_bytes=1000)
    assert len(ds[0]["blob"]) == 10
    with pytest.raises(ShardError, match=r"row 1 takes 5.3 KiB .* over the limit of 1000 B"):
        ds[1]
    assert len(HDF5Dataset(path, max_sample_bytes=None)[1]["blob"]) == 5000
    with pytest.raises(ConfigError, match="`max_sample_bytes` must be an int >= 1"):
        HDF5Dataset(path, max_sample_bytes=0)


def test_a_row_of_many_variable_length_values_stops_reading_at_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Descriptors of a 2-d vlen row may all point at one large heap object: read at once, a
    2.4 MB file asked for 3.4 GiB. Read value by value, it stops one value past the limit."""
    path = tmp_path / "wide.h5"
    with h5py.File(path, "w") as f:
        wide = f.create_dataset("x", (1, 2000), dtype=h5py.vlen_dtype(np.uint8))
        row = np.empty(2000, dtype=object)
        for i in range(2000):
            row[i] = np.full(1024 + i % 2, i % 251, dtype=np.uint8)  # ragged: no broadcast
        wide[0] = row
    ds = HDF5Dataset(path, max_sample_bytes=50_000)  # its 2,000 descriptors take 16,000
    read: list[int] = []  # bytes h5py handed back, read by read (h5py's C memory is untraced)
    real_getitem = h5py.Dataset.__getitem__

    def counting(self: Any, key: Any) -> Any:
        value = real_getitem(self, key)
        read.append(sum(len(v) for v in np.ravel(value)) if value.dtype.kind == "O" else 0)
        return value

    monkeypatch.setattr(h5py.Dataset, "__getitem__", counting)
    with pytest.raises(ShardError, match=r"row 0 takes .* over the limit of 48.8 KiB"):
        ds[0]
    assert sum(read) < 50_000, sum(read)  # the whole row is 2 MB
    monkeypatch.undo()
    whole = HDF5Dataset(path, max_sample_bytes=None)[0]["x"]
    assert len(whole) == 2000 and bytes(whole[7]) == bytes([7]) * 1025


def test_an_lmdb_sample_over_max_sample_bytes_is_refused_naming_it(tmp_path: Path):
    db = write_lmdb(tmp_path / "db", {b"a.bin": b"x" * 10, b"b.bin": b"y" * 3000})
    ds = LMDBDataset(db, max_sample_bytes=1000)
    assert ds[0]["bin"] == b"x" * 10
    with pytest.raises(ShardError, match=r"LMDB sample 'b' .* takes 2.9 KiB \(3000 bytes\), ov"):
        ds[1]
    assert LMDBDataset(db)[1]["bin"] == b"y" * 3000  # the default (256 MiB) lets it through


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (b"../../evil.jpg", "has a '..' component"),
        (b"ok/../../evil.txt", "has a '..' component"),
        (b"..\\evil.txt", "has a '..' component"),
        (b"/etc/cron.d/job.txt", "is absolute"),
        (b"\\\\server\\share.txt", "is absolute"),
        (b"C:evil.txt", "is absolute"),
        (b"cut\0here.txt", "contains a NUL character"),
    ],
)
def test_lmdb_keys_that_would_leave_the_folder_are_refused(tmp_path: Path, key: bytes, why: str):
    db = write_lmdb(tmp_path / "db", {b"fine.txt": b"a", key: b"b", b"__len__": b"2"})
    with pytest.raises(ShardError, match=rf"key .* {why}"):
        LMDBDataset(db)
    out = tmp_path / "out"
    with pytest.raises(ShardError, match=why):
        pack(LMDBSource(db), out, shard_size=1 << 20, workers=1)
    names = [m.name for p in out.glob("*.tar") for m in tarfile.open(p)] if out.exists() else []
    assert not any(".." in n or n.startswith("/") or "\0" in n for n in names)


def test_lmdb_keys_that_are_relative_paths_pack_and_read(tmp_path: Path):
    db = write_lmdb(tmp_path / "db", {b"a/b/1.txt": b"one", b"a/b/2.txt": b"two", b"x..y": b"3"})
    assert [s["__key__"] for s in LMDBDataset(db)] == ["a/b/1", "a/b/2", "x"]
    pack(LMDBSource(db), tmp_path / "out", shard_size=1 << 20, workers=1)
    assert ShardDataset(tmp_path / "out", decode="pil")[1]["txt"] == "two"


def test_pack_sources_take_the_datasets_knobs(tmp_path: Path):
    secret = write_secret(tmp_path / "home")
    data = hdf5_reaching_out(tmp_path / "dataset" / "data.h5", secret, "external")
    with pytest.raises(ShardError, match="`allow_external=True`"):
        HDF5Source(data, None)
    trusted = HDF5Source(data, ["x"], allow_external=True)
    pack(trusted, tmp_path / "out", shard_size=1 << 20, workers=1)
    assert _files_holding(tmp_path / "out", SECRET[:12]) != []

    db = write_lmdb(tmp_path / "db", {b"a.bin": b"x" * 10, b"b.bin": b"y" * 3000})
    with pytest.raises(ShardError, match=r"LMDB sample 'b' .*`max_sample_bytes`"):
        pack(
            LMDBSource(db, max_sample_bytes=1000), tmp_path / "lmdb", shard_size=1 << 20, workers=1
        )
    pack(LMDBSource(db), tmp_path / "lmdb2", shard_size=1 << 20, workers=1)
    assert ShardDataset(tmp_path / "lmdb2", decode="bytes")[1]["bin"] == b"y" * 3000
