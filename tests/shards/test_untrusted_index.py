"""index.json from elsewhere: every malformed index is a ShardError naming the field and value.

No crafted index may make a read return bytes from outside its member (a negative offset wrapped
to the end of the shard, an offset near 2**63 overflowed int64), raise a raw Python error, hang
on a FIFO, or allocate in proportion to a number it declares.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stoker.shards import ShardDataset, ShardError, build_index, read_index
from stoker.shards._index import _SHARD_FIELDS, INDEX_NAME, ShardInfo
from stoker.shards._tar import encode_sample, end_of_archive

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from _isolate import run_case

# Hard limit of a case that blocked forever before (a FIFO under the index's or a shard's name).
HANG_LIMIT_S = 30.0
# A load and a read of the three-sample shard must stay far below this (bytes, tracemalloc).
ALLOC_BUDGET = 32 * 1024 * 1024


def make_shard_dir(root: Path) -> Path:
    """Three samples ``a b c`` of ``cls`` and ``txt`` in ``a.tar``, indexed."""
    root.mkdir(parents=True, exist_ok=True)
    blob = b"".join(
        encode_sample(k, [("cls", k.encode()), ("txt", b"hello " + k.encode())]).blob for k in "abc"
    )
    (root / "a.tar").write_bytes(blob + end_of_archive(len(blob)))
    build_index(root)
    return root


def _index(directory: Path) -> dict[str, Any]:
    return json.loads((directory / INDEX_NAME).read_text())


def _write(directory: Path, obj: object) -> None:
    (directory / INDEX_NAME).write_text(json.dumps(obj))


def _shard(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["shards"][0]


def _set(field: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda obj: _shard(obj).__setitem__(field, value)


def _set_item(field: str, i: int, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda obj: _shard(obj)[field].__setitem__(i, value)


def _offset_and_size(offset: int, size: int) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        _shard(obj)["offsets"][1] = offset
        _shard(obj)["sizes"][1] = size

    return mutate


# (id, mutation of a valid index, the field the message must name)
CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("negative_offset_wrapping_to_the_end", _set_item("offsets", 1, -10), "offsets[1]"),
    ("offset_near_2_63_overflowing_int64", _offset_and_size(2**63 - 1, 5), "offsets[1]"),
    ("offset_2_64_past_int64", _set_item("offsets", 1, 2**64), "offsets[1]"),
    ("negative_size", _set_item("sizes", 1, -1), "sizes[1]"),
    ("member_ending_past_the_shard", _offset_and_size(10000, 1000), "offsets[1] + "),
    ("offset_as_float", _set_item("offsets", 1, 512.0), "offsets[1]"),
    ("offset_as_bool", _set_item("offsets", 1, True), "offsets[1]"),
    ("size_as_bool", _set("size", True), "size"),
    ("size_as_float", _set("size", 10240.5), "size"),
    ("size_as_string", _set("size", "10240"), "size"),
    ("size_past_the_int64_bound", _set("size", 2**63), "size"),
    ("name_dotdot", _set("name", ".."), "name"),
    ("name_dot", _set("name", "."), "name"),
    ("name_empty", _set("name", ""), "name"),
    ("name_with_slash", _set("name", "../a.tar"), "name"),
    ("name_with_backslash", _set("name", "..\\a.tar"), "name"),
    ("name_with_nul", _set("name", "a\0.tar"), "name"),
    ("name_not_a_string", _set("name", 7), "name"),
    ("keys_a_string_not_a_list", _set("keys", "abc"), "keys"),
    ("key_not_a_string", _set_item("keys", 0, 1), "keys[0]"),
    # Keys reach the user as `__key__`, often joined to a folder to write a file.
    ("key_with_dotdot", _set_item("keys", 0, "../../etc/cron.d/x"), "keys[0]"),
    ("key_absolute", _set_item("keys", 0, "/abs/x"), "keys[0]"),
    ("key_with_nul", _set_item("keys", 0, "a\0b"), "keys[0]"),
    ("key_empty", _set_item("keys", 0, ""), "keys[0]"),
    ("fields_of_strings_not_lists", _set("fields", ["cls"]), "fields[0]"),
    ("fields_repeating_an_extension", _set("fields", [["cls", "cls"]]), "fields[0]"),
    ("pattern_as_float", _set_item("pattern", 0, 0.0), "pattern[0]"),
    ("pattern_outside_fields", _set_item("pattern", 0, 1), "pattern[0]"),
    ("pattern_too_short", lambda o: _shard(o)["pattern"].pop(), "pattern"),
    ("offsets_too_short", lambda o: _shard(o)["offsets"].pop(), "offsets"),
    ("samples_not_len_keys", _set("samples", 10**4000), "samples"),
    ("chunk_size_zero", _set("chunk_size", 0), "chunk_size"),
    ("chunk_crc_negative", _set_item("chunk_crc32", 0, -1), "chunk_crc32[0]"),
    ("chunk_crc_past_32_bits", _set_item("chunk_crc32", 0, 2**32), "chunk_crc32[0]"),
    ("chunk_crcs_missing", _set("chunk_crc32", []), "chunk_crc32"),
    ("sha256_not_a_string", _set("sha256", 5), "sha256"),
    ("sha256_not_hex", _set("sha256", "z" * 64), "sha256"),
    ("field_missing", lambda o: _shard(o).pop("sizes"), "sizes"),
    ("shard_not_an_object", lambda o: o.__setitem__("shards", [[1, 2]]), "shards[0]"),
    ("shards_a_dict", lambda o: o.__setitem__("shards", {"x": 1}), "shards"),
    ("total_samples_wrong", lambda o: o.__setitem__("samples", 5), "samples"),
    ("total_samples_bool", lambda o: o.__setitem__("samples", True), "samples"),
    ("version_true", lambda o: o.__setitem__("version", True), "version"),
    ("meta_a_string", lambda o: o.__setitem__("meta", "abc"), "meta"),
    (
        "meta_nested_too_deep",
        lambda o: o.__setitem__("meta", json.loads("[" * 40 + "]" * 40)),
        "meta",
    ),
]


@pytest.mark.parametrize(("mutate", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_crafted_index_is_a_shard_error_naming_the_field(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], field: str
) -> None:
    directory = make_shard_dir(tmp_path / "d")
    obj = _index(directory)
    mutate(obj)
    _write(directory, obj)
    with pytest.raises(ShardError, match="not a valid stoker shard index") as info:
        read_index(directory)
    message = str(info.value)
    assert f"`shards[0].{field}" in message or f"`{field}" in message, message
    assert str(directory / INDEX_NAME) in message
    assert "Found:" in message or "is missing" in message


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"samples": ' + "9" * 5000 + "}", "\xff{}", "[1, 2]", ""],
    ids=["nesting_past_the_recursion_limit", "int_of_5000_digits", "not_utf8", "a_list", "empty"],
)
def test_an_index_that_is_not_an_index_object_is_a_shard_error(tmp_path: Path, text: str) -> None:
    directory = make_shard_dir(tmp_path / "d")
    (directory / INDEX_NAME).write_bytes(text.encode("latin-1"))
    with pytest.raises(ShardError, match="stoker shard index"):
        read_index(directory)


def test_an_index_over_the_size_cap_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = make_shard_dir(tmp_path / "d")
    size = (directory / INDEX_NAME).stat().st_size
    monkeypatch.setattr("stoker.shards._index.MAX_INDEX_BYTES", size - 1)
    with pytest.raises(ShardError, match=f"is {size} bytes, over the limit of {size - 1}"):
        read_index(directory)


def test_a_negative_offset_no_longer_reads_the_end_of_the_shard(tmp_path: Path) -> None:
    """Before: `txt` of sample a read 7 bytes from the end-of-archive zeros."""
    directory = make_shard_dir(tmp_path / "d")
    obj = _index(directory)
    _shard(obj)["offsets"][1] = -10
    _shard(obj)["sizes"][1] = 7
    _write(directory, obj)
    with pytest.raises(ShardError, match=r"offsets\[1\]` must be from 0"):
        ShardDataset(directory, verify="off")


def test_from_json_checks_on_its_own() -> None:
    with pytest.raises(ShardError, match=r"`shards\[2\]` must be a JSON object"):
        ShardInfo.from_json([], "shards[2]")


def test_an_empty_shard_file_maps_as_no_bytes(tmp_path: Path) -> None:
    """mmap refuses an empty file: a 0-byte shard raised a raw ValueError with verify='full'."""
    (tmp_path / "e.tar").write_bytes(b"")
    entry = {
        "name": "e.tar",
        "size": 0,
        "sha256": hashlib.sha256(b"").hexdigest(),
        "samples": 0,
        "keys": [],
        "fields": [],
        "pattern": [],
        "offsets": [],
        "sizes": [],
        "chunk_size": 65536,
        "chunk_crc32": [],
    }
    _write(tmp_path, {"format": "stoker.shards", "version": 1, "samples": 0, "shards": [entry]})
    ds = ShardDataset(tmp_path, verify="full")
    assert len(ds) == 0
    ds.close()


# -- FIFOs under the index's or a shard's name: an error, not a hang (in a child, hard limit) --


def case_fifo_as(tmp: str, name: str) -> dict[str, Any]:
    directory = make_shard_dir(Path(tmp) / "d")
    (directory / name).unlink()
    os.mkfifo(directory / name)
    try:
        ds = ShardDataset(directory, verify="lazy")
        ds.raw(0)
    except ShardError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


@pytest.mark.parametrize("name", [INDEX_NAME, "a.tar"])
def test_a_fifo_under_the_index_or_a_shard_name_is_an_error_not_a_hang(
    tmp_path: Path, name: str
) -> None:
    run = run_case(case_fifo_as, limit_s=HANG_LIMIT_S, tmp=str(tmp_path), name=name)
    assert run.result["error"] == "ShardError", run.result
    assert "FIFO" in run.result["message"] and name in run.result["message"]


# -- fuzz: every index either loads and reads exactly its members' bytes, or is a ShardError --

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_EDGE_INTS = [-1, 0, 1, 511, 512, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63)]
_edge = st.sampled_from(
    [*_EDGE_INTS, True, False, 1.0, "1", "", ".", "..", "a/b", None, [], {}, [[]], [0], ["cls"]]
)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_shard_dir(tmp_path_factory.mktemp("fuzz") / "d")


@pytest.fixture(scope="module")
def valid_index(shard_dir: Path) -> dict[str, Any]:
    return _index(shard_dir)


def _slots(obj: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in a JSON value."""
    out: list[tuple[Any, Any]] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, value in pairs:
            out.append((item, key))
            if isinstance(value, dict | list):
                stack.append(value)
    return out


def _check_loads_and_reads_its_members_or_refuses(directory: Path) -> None:
    tracemalloc.start()
    try:
        try:
            ds = ShardDataset(directory, verify="lazy")
        except ShardError:
            event("refused at load")
            return
        event("loaded")
        try:
            for i in range(len(ds)):
                shard, local = ds.locate(i)
                info = ds.index.shards[shard]
                try:
                    sample = ds.raw(i)
                except ShardError:
                    event("refused at read")
                    continue  # a shard name that is missing, or a shard failing its checksum
                data = (directory / info.name).read_bytes()
                for ext, offset, size in info.members(local):
                    assert 0 <= offset and offset + size <= len(data), (ext, offset, size)
                    assert bytes(sample[ext]) == data[offset : offset + size]
                del sample
        finally:
            ds.close()
        _, peak = tracemalloc.get_traced_memory()
        assert peak < ALLOC_BUDGET, f"loading and reading took {peak} bytes"
    finally:
        tracemalloc.stop()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_mutated_index_reads_true_bytes_or_is_a_shard_error(
    data: st.DataObject, shard_dir: Path, valid_index: dict[str, Any]
) -> None:
    obj = copy.deepcopy(valid_index)
    shard = _shard(obj)
    for _ in range(data.draw(st.integers(0, 3), label="moved members")):
        field = shard[data.draw(st.sampled_from(["offsets", "sizes"]), label="field")]
        i = data.draw(st.integers(0, len(field) - 1), label="member")
        field[i] += data.draw(st.integers(-1100, 1100), label="delta")
    for _ in range(data.draw(st.integers(0, 2), label="mutations")):
        slots = _slots(obj)
        if not slots:
            break
        container, key = data.draw(st.sampled_from(slots), label="slot")
        old = container[key]
        op = data.draw(st.sampled_from(["replace", "edge", "nudge", "delete"]), label="op")
        if op == "delete":
            del container[key]
        elif op == "nudge" and type(old) is int:
            container[key] = old + data.draw(st.integers(-600, 600), label="delta")
        else:
            container[key] = data.draw(_edge if op == "edge" else _json, label="value")
    _write(shard_dir, obj)
    _check_loads_and_reads_its_members_or_refuses(shard_dir)


_shard_like = st.fixed_dictionaries(dict.fromkeys(_SHARD_FIELDS, _json | _edge))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    obj=_json
    | st.fixed_dictionaries(
        {
            "format": st.just("stoker.shards") | _json,
            "version": st.just(1) | _json,
            "samples": _json | _edge,
            "meta": _json,
            "shards": st.lists(_shard_like, max_size=3) | _json,
        }
    )
)
def test_fuzz_random_json_reads_true_bytes_or_is_a_shard_error(obj: Any, shard_dir: Path) -> None:
    _write(shard_dir, obj)
    _check_loads_and_reads_its_members_or_refuses(shard_dir)
