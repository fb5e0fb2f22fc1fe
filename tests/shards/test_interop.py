"""Interop with the real webdataset package, and LMDB / HDF5 round trips through pack."""

from __future__ import annotations

import io
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
import torch.utils.data as tud
import webdataset as wds
from PIL import Image
from shard_helpers import run_cli

from stoker.shards import HDF5Dataset, LMDBDataset, ShardDataset, pack, read_index


def _urls(directory: Path) -> list[str]:
    return [str(directory / s.name) for s in read_index(directory).shards]


def test_webdataset_reads_packed_shards_byte_identical(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack("shard_factories:fields_dataset", out, shard_size=40_000, workers=2)
    ours = ShardDataset(out, decode="bytes")
    theirs = list(wds.WebDataset(_urls(out), shardshuffle=False))
    assert len(theirs) == len(ours) == 40 and len(_urls(out)) > 1
    for i, sample in enumerate(theirs):
        mine = ours[i]
        assert sample["__key__"] == mine["__key__"]
        fields = {k: v for k, v in sample.items() if not k.startswith("__")}
        assert fields == {k: v for k, v in mine.items() if not k.startswith("__")}
    # And webdataset's own decoders understand our encodings.
    decoded = next(iter(wds.WebDataset(_urls(out)[:1], shardshuffle=False).decode("rgb8")))
    assert decoded["cls"] == 0 and decoded["json"] == {"i": 0, "name": "sample 0"}
    assert decoded["png"].shape == (8, 8, 3)
    np.testing.assert_array_equal(decoded["npy"], np.load(io.BytesIO(ours[0]["npy"])))


def test_webdataset_shardwriter_output_is_indexed_and_read(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    samples = []
    for i in range(30):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(buf, format="JPEG")
        samples.append(
            {
                "__key__": f"s{i:04d}",
                "jpg": buf.getvalue(),
                "cls": str(i % 4).encode(),
                "meta.json": b'{"i": %d}' % i,
            }
        )
    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=7, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    assert len(list(tmp_path.glob("wds-*.tar"))) == 5
    assert run_cli("index", str(tmp_path)) == 0
    ds = ShardDataset(tmp_path, decode="bytes", verify="full")
    assert len(ds) == 30
    for i, ref in enumerate(samples):
        got = ds[i]
        assert got["__key__"] == ref["__key__"]
        assert {k: got[k] for k in ("jpg", "cls", "meta.json")} == {
            k: ref[k] for k in ("jpg", "cls", "meta.json")
        }
    decoded = ShardDataset(tmp_path, decode="numpy")[3]
    assert decoded["meta.json"] == {"i": 3} and decoded["jpg"].shape == (12, 10, 3)


def _make_lmdb(path: Path, n: int) -> list[dict[str, bytes]]:
    rng = np.random.default_rng(2)
    samples = []
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.put(b"__len__", str(n).encode())
        for i in range(n):
            sample = {"cls": str(i % 3).encode(), "bin": rng.bytes(int(rng.integers(1, 5000)))}
            for ext, value in sample.items():
                txn.put(f"k{i:05d}.{ext}".encode(), value)
            samples.append(sample)
        txn.put(b"plain", b"no extension")
    env.close()
    return samples


def test_lmdb_round_trip(tmp_path: Path) -> None:
    samples = _make_lmdb(tmp_path / "db", 25)
    direct = LMDBDataset(tmp_path / "db", decode="pil", fields=("bin", "cls"))
    assert len(direct) == 26  # 25 samples + the record without an extension
    assert direct[4] == (samples[4]["bin"], 4 % 3)
    pack(tmp_path / "db", tmp_path / "out", shard_size=30_000, workers=2)
    ds = ShardDataset(tmp_path / "out", decode="bytes")
    assert len(ds) == 26 and len(ds.shard_names) > 1
    for i in range(25):
        assert ds[i]["__key__"] == f"k{i:05d}"
        assert {k: ds[i][k] for k in ("cls", "bin")} == samples[i]
    assert ds[25]["bin"] == b"no extension" and ds[25]["__key__"] == "plain"
    direct.close()


def _make_hdf5(path: Path, n: int) -> tuple[np.ndarray, list[bytes]]:
    rng = np.random.default_rng(3)
    features = rng.standard_normal((n, 4, 2)).astype(np.float32)
    jpegs = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)).save(buf, format="JPEG")
        jpegs.append(buf.getvalue())
    with h5py.File(path, "w") as f:
        f["features"] = features
        f["label"] = np.arange(n, dtype=np.int64) % 5
        images = f.create_dataset("image", (n,), dtype=h5py.vlen_dtype(np.uint8))
        for i, data in enumerate(jpegs):
            images[i] = np.frombuffer(data, dtype=np.uint8)
        f.create_dataset(
            "caption", data=[f"caption {i}" for i in range(n)], dtype=h5py.string_dtype()
        )
    return features, jpegs


def test_hdf5_round_trip(tmp_path: Path) -> None:
    features, jpegs = _make_hdf5(tmp_path / "data.h5", 20)
    direct = HDF5Dataset(tmp_path / "data.h5")
    row = direct[7]
    assert set(row) == {"features", "label", "image", "caption"}
    np.testing.assert_array_equal(row["features"], features[7])
    assert row["image"] == jpegs[7] and row["caption"] == "caption 7" and row["label"] == 2
    pack(tmp_path / "data.h5", tmp_path / "out", shard_size=12_000)
    ds = ShardDataset(tmp_path / "out", decode="numpy")
    assert len(ds) == 20 and len(ds.shard_names) > 1
    sample = ds[7]
    assert set(sample) - {"__key__", "__shard__"} == {
        "features.npy",
        "label.cls",
        "image.jpg",
        "caption.txt",
    }
    np.testing.assert_array_equal(sample["features.npy"], features[7])
    assert sample["label.cls"] == 2 and sample["caption.txt"] == "caption 7"
    assert bytes(ShardDataset(tmp_path / "out")[7]["image.jpg"]) == jpegs[7]
    tuples = HDF5Dataset(tmp_path / "data.h5", fields=["label", "caption"])
    assert tuples[3] == (3, "caption 3")
    direct.close()


def _as_list(batch: list) -> list:
    return batch


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_lmdb_and_hdf5_datasets_in_workers(tmp_path: Path, context: str) -> None:
    samples = _make_lmdb(tmp_path / "db", 12)
    features, jpegs = _make_hdf5(tmp_path / "data.h5", 12)
    db = LMDBDataset(tmp_path / "db", decode="pil")
    h5 = HDF5Dataset(tmp_path / "data.h5", fields=["features", "image"])
    db[0], h5[0]  # handles open in the parent first: workers must open their own
    got_db = [
        s
        for batch in tud.DataLoader(
            db, batch_size=3, num_workers=2, collate_fn=_as_list, multiprocessing_context=context
        )
        for s in batch
    ]
    assert [(s["cls"], s["bin"]) for s in got_db[:12]] == [
        (int(ref["cls"]), ref["bin"]) for ref in samples
    ]
    got_h5 = [
        s
        for batch in tud.DataLoader(
            h5, batch_size=3, num_workers=2, collate_fn=_as_list, multiprocessing_context=context
        )
        for s in batch
    ]
    assert all(
        np.array_equal(f, features[i]) and img == jpegs[i] for i, (f, img) in enumerate(got_h5)
    )
    assert len(got_h5) == 12
    db.close()
    h5.close()
