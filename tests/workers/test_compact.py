"""stoker.compact: same values, flat buffers, clear errors."""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stoker.workers._compact import compact


@given(st.lists(st.text(), max_size=50))
def test_strings_round_trip(values):
    c = compact(values)
    assert list(c) == values and len(c) == len(values)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50))
def test_ints_round_trip(values):
    assert list(compact(values)) == values


@given(st.lists(st.tuples(st.text(), st.integers(0, 1000), st.binary()), max_size=30))
def test_tuple_rows_round_trip(rows):
    assert list(compact(rows)) == rows


def test_indexing_like_a_list():
    c = compact(["a", "bb", "ccc"])
    assert c[0] == "a" and c[-1] == "ccc" and c[1:] == ["bb", "ccc"]
    with pytest.raises(IndexError):
        c[3]


def test_takes_a_fraction_of_the_list_memory_and_pickles():
    paths = [f"/data/train/{i:07d}.jpg" for i in range(10_000)]
    c = compact(paths)
    as_objects = sys.getsizeof(paths) + sum(sys.getsizeof(p) for p in paths)
    assert c.nbytes < as_objects / 2
    assert pickle.loads(pickle.dumps(c))[1234] == paths[1234]


def test_mixed_kinds_name_the_element():
    with pytest.raises(TypeError, match="element 2 is int"):
        compact(["a", "b", 3])
    with pytest.raises(TypeError, match="element 1 is a float"):
        compact([1, 2.5])
    with pytest.raises(TypeError, match="tuple of 2 values"):
        compact([("a", 1), ("b",)])


def test_numpy_integers_are_accepted():
    assert list(compact(list(np.arange(5)))) == [0, 1, 2, 3, 4]


def test_forked_reads_do_not_copy_the_buffers():
    import psutil

    values = compact([f"/some/long/path/number/{i:09d}.jpeg" for i in range(300_000)])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: read everything, report private (copied) bytes
        try:
            os.close(r)
            before = psutil.Process().memory_full_info().uss
            total = sum(len(v) for v in values)
            after = psutil.Process().memory_full_info().uss
            os.write(w, f"{after - before} {total}".encode())
        finally:
            os._exit(0)
    os.close(w)
    grown, total = map(int, os.read(r, 100).split())
    os.close(r)
    os.waitpid(pid, 0)
    assert total == sum(len(v) for v in values)
    # The buffers are ~12 MB; reading them must not copy them into the child.
    assert grown < 4 << 20
