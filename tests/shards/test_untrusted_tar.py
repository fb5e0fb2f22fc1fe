"""Tar shards from elsewhere: members that are not regular files, and names that would leave the
folder they are unpacked to, are a ShardError naming the member; a malformed header never
escapes as a raw Python error or allocates what it declares."""

from __future__ import annotations

import io
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stoker.shards import ShardDataset, ShardError, ShardWriter, build_index
from stoker.shards._describe import describe_shard
from stoker.shards._tar import (
    BLOCK,
    EncodedSample,
    check_member_name,
    encode_sample,
    end_of_archive,
    member_name_problem,
)

# Describing a malformed archive of a few KiB must stay far below this (bytes, tracemalloc).
ALLOC_BUDGET = 32 * 1024 * 1024


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _archive(path: Path, middle: dict[str, object] | None, fmt: int = tarfile.PAX_FORMAT) -> Path:
    """``a.txt``, the member described by ``middle`` (``_add``'s arguments), ``c.txt``."""
    with tarfile.open(path, "w", format=fmt) as tar:
        _add(tar, "a.txt", b"first")
        if middle is not None:
            _add(tar, **middle)  # type: ignore[arg-type]
        _add(tar, "c.txt", b"SECRET-NEXT-MEMBER" * 10)
    return path


_SPARSE_MAP = b"1\n0\n4\n".ljust(BLOCK, b"\0")
# (id, the middle member, what the message must say)
MEMBERS: list[tuple[str, dict[str, object], str]] = [
    (
        "pax_sparse_indexed_at_its_expanded_size",
        {
            "name": "GNUSparseFile.0/b.txt",
            "data": _SPARSE_MAP + b"DATA",
            "pax_headers": {
                "GNU.sparse.major": "1",
                "GNU.sparse.minor": "0",
                "GNU.sparse.name": "b.txt",
                "GNU.sparse.realsize": "3000",
            },
        },
        "is a sparse file",
    ),
    ("gnu_sparse", {"name": "b.txt", "type": tarfile.GNUTYPE_SPARSE}, "is a sparse file"),
    (
        "symlink",
        {"name": "b.txt", "type": tarfile.SYMTYPE, "linkname": "/etc/passwd"},
        "is a symbolic link",
    ),
    ("hardlink", {"name": "b.txt", "type": tarfile.LNKTYPE, "linkname": "a.txt"}, "is a hard link"),
    ("fifo", {"name": "b.txt", "type": tarfile.FIFOTYPE}, "is a FIFO"),
    ("char_device", {"name": "b.txt", "type": tarfile.CHRTYPE}, "is a character device"),
    ("block_device", {"name": "b.txt", "type": tarfile.BLKTYPE}, "is a block device"),
    ("unknown_type", {"name": "b.txt", "type": b"V", "data": b"x"}, "of unknown type b'V'"),
    ("absolute_name", {"name": "/etc/b.txt", "data": b"x"}, "is absolute"),
    ("dotdot_name", {"name": "../../b.txt", "data": b"x"}, "has a '..' component"),
    ("backslash_dotdot_name", {"name": "a\\..\\..\\b.txt", "data": b"x"}, "'..' component"),
    (
        "nul_in_a_pax_name",
        {"name": "b.txt", "data": b"x", "pax_headers": {"path": "b\0evil.txt"}},
        "contains a NUL",
    ),
]


@pytest.mark.parametrize(("middle", "says"), [m[1:] for m in MEMBERS], ids=[m[0] for m in MEMBERS])
def test_a_member_that_is_not_a_safe_regular_file_is_refused_naming_it(
    tmp_path: Path, middle: dict[str, object], says: str
) -> None:
    _archive(tmp_path / "x.tar", middle)
    with pytest.raises(ShardError, match="member") as info:
        build_index(tmp_path)
    message = str(info.value)
    assert says in message and "x.tar" in message, message
    assert not (tmp_path / "index.json").exists()


def test_a_sparse_member_no_longer_reads_the_next_members_bytes(tmp_path: Path) -> None:
    """Before: `b.txt` was indexed at its 3000-byte expanded size and reading it returned the
    headers and data of `c.txt` after it."""
    _archive(tmp_path / "x.tar", MEMBERS[0][1])
    with pytest.raises(ShardError, match=r"member 'b\.txt' .* is a sparse file"):
        build_index(tmp_path)


@pytest.mark.parametrize("where", ["member", "global"])
def test_a_pax_header_that_grows_a_members_size_is_refused(tmp_path: Path, where: str) -> None:
    """A pax record (``GNU.sparse.realsize`` alone on the member, or ``size`` in a global
    header) made tarfile report 65,536 bytes for a 440-byte member; indexed at that size,
    reading it returned the headers and data of the members after it."""
    data, after = b"SPARSE-DATA" * 40, b"OTHER-MEMBER " * 8000
    globals_ = {"size": "65536"} if where == "global" else None
    with tarfile.open(
        tmp_path / "x.tar", "w", format=tarfile.PAX_FORMAT, pax_headers=globals_
    ) as t:
        info = tarfile.TarInfo("a.bin")
        info.size = len(data)
        if where == "member":
            info.pax_headers = {"GNU.sparse.realsize": "65536"}
        t.addfile(info, io.BytesIO(data))
        _add(t, "z.other", after)
    with pytest.raises(ShardError, match=r"member 'a\.bin' .* declares 65536 bytes .* next member"):
        build_index(tmp_path)
    assert not (tmp_path / "index.json").exists()


def test_folder_entries_are_skipped(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "x.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "d", type=tarfile.DIRTYPE)
        _add(tar, "d/a.txt", b"inside")
    build_index(tmp_path)
    ds = ShardDataset(tmp_path, decode="bytes")
    assert [(s["__key__"], s["txt"]) for s in (ds[i] for i in range(len(ds)))] == [
        ("d/a", b"inside")
    ]
    ds.close()


def _gnu_long_name_chain(path: Path, links: int) -> None:
    """``links`` GNU long-name headers in a row, then a regular member."""
    long = tarfile.TarInfo._create_gnu_long_header(  # type: ignore[attr-defined]
        "x" * 200 + ".txt", tarfile.GNUTYPE_LONGNAME, "utf-8", "surrogateescape"
    )
    member = tarfile.TarInfo("a.txt")
    member.size = 1
    body = long * links + member.tobuf(tarfile.GNU_FORMAT) + b"y".ljust(BLOCK, b"\0")
    path.write_bytes(body + end_of_archive(len(body)))


def test_a_chain_of_gnu_long_name_headers_is_a_shard_error(tmp_path: Path) -> None:
    """tarfile follows each long-name header by recursion: 2000 of them raised RecursionError."""
    _gnu_long_name_chain(tmp_path / "x.tar", 2000)
    with pytest.raises(ShardError, match="not a readable uncompressed tar"):
        describe_shard(tmp_path / "x.tar")


def _header(name: str, size_field: bytes, kind: bytes) -> bytes:
    """A ustar header whose 12-byte size field is ``size_field``, checksum recomputed."""
    info = tarfile.TarInfo(name)
    info.type = kind
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    block[124:136] = size_field
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _base256(n: int) -> bytes:
    return bytes([0x80]) + n.to_bytes(11, "big")


@pytest.mark.parametrize(
    ("kind", "size"),
    [(tarfile.XHDTYPE, 8**11 - 1), (tarfile.GNUTYPE_LONGNAME, 8**11 - 1), (tarfile.REGTYPE, 2**80)],
    ids=["pax_header_declaring_8_gib", "long_name_declaring_8_gib", "member_declaring_2_80_bytes"],
)
def test_a_header_declaring_a_huge_size_is_refused_without_allocating_it(
    tmp_path: Path, kind: bytes, size: int
) -> None:
    """tarfile reads a pax or long-name header's declared size at once (read(n) allocates n);
    a base-256 size past 2**63 overflowed a seek."""
    field = b"%011o\0" % size if size < 8**11 else _base256(size)
    body = _header("a.txt", field, kind) + b"path=x\n".ljust(BLOCK, b"\0")
    (tmp_path / "x.tar").write_bytes(body + end_of_archive(len(body)))
    tracemalloc.start()
    try:
        with pytest.raises(ShardError, match=r"x\.tar"):
            describe_shard(tmp_path / "x.tar")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_BUDGET, f"describing the archive took {peak} bytes"


def test_a_truncated_member_is_a_shard_error(tmp_path: Path) -> None:
    blob = encode_sample("k", [("txt", b"z" * 5000)]).blob
    (tmp_path / "x.tar").write_bytes(blob[:2000])
    with pytest.raises(ShardError, match=r"x\.tar"):
        build_index(tmp_path)


# -- names that stoker writes --


@pytest.mark.parametrize("key", ["/abs", "../up", "a/../../up", "a\\..\\up", "nul\0key", "C:x"])
def test_a_key_that_would_leave_the_folder_is_refused_when_written(
    key: str, tmp_path: Path
) -> None:
    assert member_name_problem(f"{key}.txt") is not None
    with pytest.raises(ShardError, match="member name"):
        check_member_name(f"{key}.txt")
    with pytest.raises(ValueError, match="member name"):
        encode_sample(key, [("txt", b"x")])
    # A sample built by hand (as an LMDB key would arrive) is refused by the writer itself.
    good = encode_sample("k", [("txt", b"x")])
    forged = EncodedSample(key, good.blob, good.members)
    writer = ShardWriter(tmp_path, shard_size=1 << 20)
    with pytest.raises(ShardError, match="member name"):
        writer.write(forged)
    writer.abort()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["a.txt", "dir/sub/a.b.txt", "./a.txt", "a..b.txt", "..a.txt"])
def test_relative_names_are_accepted(name: str) -> None:
    assert member_name_problem(name) is None
    assert check_member_name(name) == name


# -- fuzz: a mutated archive is described within its bytes, or is a ShardError --


def _pax_archive() -> bytes:
    blob = b"".join(
        encode_sample(k, [("cls", b"1"), ("txt", k.encode() * 40)]).blob for k in ("a", "b/c")
    )
    return blob + end_of_archive(len(blob))


def _gnu_archive() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "d/" + "n" * 150 + ".txt", b"long name")
        _add(tar, "e.cls", b"2")
    return out.getvalue()


ARCHIVES = {"pax": _pax_archive(), "gnu": _gnu_archive()}


def _header_offsets(data: bytes) -> list[int]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [m.offset for m in tar] + [m.offset_data - BLOCK for m in tar]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_mutated_archive_is_described_within_its_bytes_or_is_a_shard_error(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kind = data.draw(st.sampled_from(sorted(ARCHIVES)), label="archive")
    buf = bytearray(ARCHIVES[kind])
    headers = _header_offsets(bytes(buf))
    for _ in range(data.draw(st.integers(1, 6), label="changes")):
        at = data.draw(st.sampled_from(headers), label="header") + data.draw(
            st.integers(0, BLOCK - 1), label="byte"
        )
        buf[at] = data.draw(st.integers(0, 255), label="value")
    if data.draw(st.booleans(), label="truncate"):
        del buf[data.draw(st.integers(0, len(buf)), label="length") :]
    path = tmp_path_factory.mktemp("tar") / "x.tar"
    path.write_bytes(bytes(buf))
    tracemalloc.start()
    try:
        info = describe_shard(path)
    except ShardError:
        event("refused")
        return
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    event("described")
    assert peak < ALLOC_BUDGET, f"describing took {peak} bytes"
    assert ((info.offsets >= 0) & (info.offsets + info.sizes <= len(buf))).all()
    for i, key in enumerate(info.keys):
        for ext, _, _ in info.members(i):
            assert member_name_problem(f"{key}.{ext}") is None, (key, ext)
