"""A batch handed from a forked child through an anonymous memory file (real fork, real memfd,
real SCM_RIGHTS): every dtype and layout arrives equal, views the file's pages, and a header
that does not fit the file is refused."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
from typing import Any

import numpy as np
import pytest
import torch

from stoker.transport._handoff import HANDOFF_SLOT, open_arena, pack, unpack
from stoker.workers import _collate

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create (Linux)"),
]


def _batch() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    return {
        "f32": base,
        "f16": base.half(),
        "bf16": base.bfloat16(),
        "i64": torch.arange(7),
        "bool": base > 0,
        "c64": torch.complex(base, -base),
        "strided": base.t(),  # not contiguous
        "tail": base[2:, 1:],  # a view at an offset
        "np": np.arange(12, dtype=np.float64).reshape(3, 4),
        "meta": ["a", 3, None],
    }


def _through_a_child(make: Any, reserve: int = 0) -> tuple[Any, Any]:
    """``make()`` in a forked child, packed there, unpacked here; with ``reserve``, made
    with an arena of that many bytes installed for collation (as the head start does)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            torch.set_num_threads(1)  # (libgomp's pool, used by the parent, hangs a fork)
            arena = open_arena(reserve) if reserve else None
            _collate.install(arena)
            packed = pack(make(), arena)
            assert packed is not None
            fd, place = packed
            socket.send_fds(child, [pickle.dumps(place)], [fd])
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    child.close()
    parent.settimeout(30)  # a child that hangs fails the test instead
    try:
        data, fds, _, _ = socket.recv_fds(parent, 4096, 1)
    except BaseException:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        raise
    finally:
        parent.close()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and len(fds) == 1
    try:
        return unpack(fds[0], *pickle.loads(data)), pickle.loads(data)
    finally:
        os.close(fds[0])


def test_every_dtype_and_layout_arrives_equal_and_views_the_file() -> None:
    got, place = _through_a_child(_batch)
    want = _batch()
    assert place[0] == HANDOFF_SLOT
    for key in ("f32", "f16", "bf16", "i64", "bool", "c64", "strided", "tail"):
        assert got[key].dtype == want[key].dtype
        assert torch.equal(got[key], want[key]), key
    np.testing.assert_array_equal(got["np"], want["np"])
    assert got["meta"] == ["a", 3, None]
    # Views of one mapping (no copy per tensor): the first two share a storage's pages.
    first = got["f32"].untyped_storage().data_ptr()
    assert got["i64"].untyped_storage().data_ptr() == first


def test_a_batch_without_tensors_is_its_header() -> None:
    got, place = _through_a_child(lambda: {"names": ["x"] * 1000, "n": 3})
    assert place[0] is None
    assert got == {"names": ["x"] * 1000, "n": 3}


def test_a_header_that_does_not_fit_the_file_is_refused() -> None:
    fd = os.memfd_create("stoker-test")
    try:
        os.ftruncate(fd, 4096)
        with pytest.raises(ValueError, match="4096-byte file"):
            unpack(fd, HANDOFF_SLOT, 4000, 200)
        with pytest.raises(ValueError, match="names slot"):
            unpack(fd, "stoker-123-w0", 0, 10)
    finally:
        os.close(fd)


def _collated() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    samples = [{"x": torch.randn(3, 8, generator=g), "y": i} for i in range(5)]
    batch = torch.utils.data.default_collate(samples)
    arena = _collate._arena
    if arena is not None:  # in the child: stacked into the file itself
        assert arena.current is not None
        assert batch["x"].untyped_storage().data_ptr() == arena.current.addr
    batch["extra"] = torch.arange(4)  # made outside collation: copied in after
    batch["alias"] = batch["x"][1:3]  # a view of what collation wrote in place
    return batch


def test_collation_writes_into_the_file_and_the_file_is_cut_to_what_it_holds() -> None:
    got, place = _through_a_child(_collated, reserve=1 << 30)
    want = _collated()
    for key in ("x", "y", "extra", "alias"):
        assert torch.equal(got[key], want[key]), key
    # All of it on one mapping of a file cut from 1 GiB to about a page or two.
    x = got["x"].untyped_storage()
    assert got["alias"].untyped_storage().data_ptr() == x.data_ptr()
    assert got["extra"].untyped_storage().data_ptr() == x.data_ptr()
    assert place[1] + place[2] <= 3 * 4096


def test_a_batch_that_outgrows_the_arena_is_left_to_a_worker() -> None:
    arena = open_arena(64 * 1024)
    assert arena is not None
    _collate.install(arena)
    try:
        samples = [torch.zeros(1024) for _ in range(8)]  # 32 KiB: collated in place
        batch = [torch.utils.data.default_collate(samples), torch.zeros(16 * 1024)]  # 64 KiB
        fd = arena.fd
        assert pack(batch, arena) is None
        with pytest.raises(OSError):  # closed by pack
            os.fstat(fd)
    finally:
        _collate.install(None)


def test_an_arena_that_gave_nothing_out_grows_for_a_larger_batch() -> None:
    got, place = _through_a_child(lambda: {"big": torch.ones(40_000)}, reserve=4096)
    assert torch.equal(got["big"], torch.ones(40_000))
    assert place[0] == HANDOFF_SLOT


def test_a_large_allocation_is_faulted_in_at_once_and_a_small_one_is_not() -> None:
    from stoker.transport._handoff import POPULATE_BYTES

    arena = open_arena(8 * POPULATE_BYTES)
    assert arena is not None
    try:

        def resident() -> int:  # bytes of the memory file that hold pages
            return os.fstat(arena.fd).st_blocks * 512

        assert resident() == 0  # sparse until written
        small = arena.alloc(POPULATE_BYTES // 2)
        assert small is not None and resident() == 0
        big = arena.alloc(2 * POPULATE_BYTES)
        assert big is not None
        assert resident() >= 2 * POPULATE_BYTES  # before anything was written to it
        big.fill_(7)  # still writable, and written where it was given out
        assert int(big.sum()) == 7 * 2 * POPULATE_BYTES
    finally:
        os.close(arena.fd)
