"""Typed worker messages (stoker.workers._messages): every kind crosses a pipe intact, as a
plain tuple that costs what the positional tuples did."""

from __future__ import annotations

import pickle

import pytest

from stoker.workers._messages import (
    BatchError,
    BatchSkipped,
    BatchTask,
    EpochStart,
    GaveUp,
    Kind,
    Ready,
    Retired,
    SlotBatch,
    StartFailed,
    StreamEnd,
    ThreadBatch,
    from_wire,
    to_wire,
)

EVERY_KIND = [
    BatchTask(2, 7, 12345, [1, 2, 3]),
    EpochStart(2, b"changes", 4, {0: {"pos": 3}}),
    SlotBatch(2, 7, 1, ((1, 0.5),), ((0.1, 0.2),), "slot-1", ["old"], b"hdr", 0, [], None),
    ThreadBatch(2, 7, 1, ((1, 0.5),), (), [1, 2, 3], []),
    BatchError(2, 7, 1, b"packed"),
    BatchSkipped(2, 7, 1, [("i", "err")]),
    StreamEnd(2, 7, 1, {"pos": 9}),
    GaveUp(2, 7, 1),
    Ready(1),
    Retired(2, 1),
    StartFailed(1, b"packed"),
]


@pytest.mark.parametrize("msg", EVERY_KIND, ids=lambda m: type(m).__name__)
def test_every_kind_round_trips_through_pickle(msg) -> None:
    raw = pickle.loads(pickle.dumps(to_wire(msg), protocol=5))
    back = from_wire(raw)
    assert type(back) is type(msg) and back == msg


def test_each_kind_has_its_own_code() -> None:
    codes = [to_wire(msg)[0] for msg in EVERY_KIND]
    assert len(set(codes)) == len(codes) == len(Kind)
    assert {Kind(code) for code in codes} == set(Kind)


@pytest.mark.parametrize("msg", EVERY_KIND, ids=lambda m: type(m).__name__)
def test_the_wire_form_pickles_as_a_plain_tuple(msg) -> None:
    """No class reference in the pickle: the same bytes as the positional tuple."""
    wire = to_wire(msg)
    assert type(wire) is tuple and all(type(part) is not Kind for part in wire)
    assert pickle.dumps(wire, protocol=5) == pickle.dumps((wire[0], *tuple(msg)), protocol=5)
    assert type(msg).__name__.encode() not in pickle.dumps(wire, protocol=5)


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(KeyError):
        from_wire(("?", 1, 2))
