"""Tar member offsets, WebDataset's name rule and index.json, checked against tarfile."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from webdataset.tariterators import base_plus_ext

from stoker.shards import IncompleteShardsError, ShardError, build_index, read_index
from stoker.shards._describe import describe_shard
from stoker.shards._index import INDEX_NAME
from stoker.shards._tar import encode_sample, end_of_archive, split_name

# Relative names only: an absolute key is refused (test_untrusted).
_key = st.from_regex(r"([A-Za-z0-9_\-][A-Za-z0-9_\-/]{0,19})?[A-Za-z0-9_\-]{1,130}", fullmatch=True)
_ext = st.from_regex(r"[a-z0-9]{1,5}(\.[a-z0-9]{1,4})?", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(
    samples=st.lists(
        st.tuples(_key, st.dictionaries(_ext, st.binary(max_size=1500), min_size=1, max_size=3)),
        min_size=1,
        max_size=6,
        unique_by=lambda s: s[0],
    )
)
def test_recorded_offsets_are_where_tarfile_finds_the_data(samples, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("tar") / "x.tar"
    expected = []
    with open(path, "wb") as f:
        pos = 0
        for key, fields in samples:
            enc = encode_sample(key, sorted(fields.items()))
            f.write(enc.blob)
            expected += [(f"{key}.{ext}", pos + off, size) for ext, off, size in enc.members]
            pos += len(enc.blob)
        f.write(end_of_archive(pos))
    with tarfile.open(path) as tar:
        found = [(m.name, m.offset_data, m.size) for m in tar]
        assert found == expected
        for name, off, size in expected:
            data = path.read_bytes()[off : off + size]
            assert tar.extractfile(name).read() == data  # type: ignore[union-attr]
    assert path.stat().st_size % 10240 == 0


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab./_-Xé", max_size=12))
def test_split_name_agrees_with_webdataset(name: str) -> None:
    key, ext = base_plus_ext(name)
    expected = None if key is None else (key, ext.lower())
    assert split_name(name) == expected


def test_encode_rejects_a_key_with_a_dot() -> None:
    with pytest.raises(ValueError, match="does not split"):
        encode_sample("a.b", [("jpg", b"x")])


def test_index_round_trips_and_is_deterministic(tmp_path: Path) -> None:
    with open(tmp_path / "a.tar", "wb") as f:
        blob = b"".join(encode_sample(k, [("cls", b"1"), ("txt", b"hi")]).blob for k in "xyz")
        f.write(blob + end_of_archive(len(blob)))
    first = build_index(tmp_path)
    text = (tmp_path / INDEX_NAME).read_bytes()
    again = build_index(tmp_path)
    assert (tmp_path / INDEX_NAME).read_bytes() == text
    loaded = read_index(tmp_path)
    assert loaded.samples == first.samples == again.samples == 3
    assert loaded.shards[0].keys == ("x", "y", "z")
    assert loaded.shards[0].members(1) == first.shards[0].members(1)


def test_repeated_extension_in_one_key_is_rejected(tmp_path: Path) -> None:
    with open(tmp_path / "a.tar", "wb") as f:
        blob = encode_sample("k", [("txt", b"a")]).blob * 2
        f.write(blob + end_of_archive(len(blob)))
    with pytest.raises(ShardError, match=r"repeats extension 'txt' of key 'k'"):
        describe_shard(tmp_path / "a.tar")


def test_missing_and_bad_index_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(IncompleteShardsError, match="stoker pack SRC"):
        read_index(tmp_path)
    (tmp_path / "a.tar").write_bytes(end_of_archive(0))
    with pytest.raises(IncompleteShardsError, match="stoker index"):
        read_index(tmp_path)
    build_index(tmp_path)
    obj = json.loads((tmp_path / INDEX_NAME).read_text())
    obj["samples"] = 5
    (tmp_path / INDEX_NAME).write_text(json.dumps(obj))
    with pytest.raises(ShardError, match="stoker index"):
        read_index(tmp_path)
    (tmp_path / "b.tar.gz").write_bytes(b"\x1f\x8b not a tar")
    with pytest.raises(ShardError, match="not a readable uncompressed tar"):
        build_index(tmp_path, shards=["b.tar.gz"])
