"""Encoding batches into slots and rebuilding them as views, in one process."""

from __future__ import annotations

import gc
import pickle
import warnings
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from _codec_support import new_prefix, offset_in_slot, roundtrip
from torch.utils.data import default_collate
from torch.utils.data._utils import collate as torch_collate

from stoker.transport import SlotArena, SlotMap, decode, encode, unlink_owned
from stoker.transport._codec import _DTYPES
from stoker.workers import _collate

Pair = namedtuple("Pair", ["image", "label"])


@dataclass
class Sample:
    x: torch.Tensor
    name: str


def _sample_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    return torch.randint(0, 100, shape).to(dtype)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 4), (4, 3, 5)])
def test_every_dtype_and_shape_survives(pool, dtype, shape):
    arena, slots = pool
    t = _sample_tensor(dtype, shape)
    out, enc = roundtrip({"t": t}, arena, slots)
    assert out["t"].dtype == dtype and out["t"].shape == t.shape
    as_bytes = out["t"].reshape(-1).view(torch.uint8)
    assert torch.equal(as_bytes, t.reshape(-1).contiguous().view(torch.uint8))
    assert enc.slot is not None and not enc.fallback


def test_numpy_arrays_of_any_layout_survive(pool):
    arena, slots = pool
    arrays = [
        np.arange(12, dtype=">i4").reshape(3, 4),
        np.zeros(3, dtype=[("a", "<f8"), ("b", "u1")]),
        np.arange(20, dtype=np.float32).reshape(4, 5).T,
        np.array(7, dtype=np.int16),
    ]
    out, enc = roundtrip(arrays, arena, slots)
    for got, want in zip(out, arrays, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert enc.slot is not None


def test_nested_structures_keep_their_types(pool):
    arena, slots = pool
    batch = {
        "pair": Pair(torch.ones(2, 3), torch.tensor([1, 2])),
        "samples": [Sample(torch.arange(4), "a"), Sample(torch.arange(2), "b")],
        "names": ["x", "y"],
        "n": 3,
        "nothing": None,
        "t": (torch.zeros(1), 2.5),
    }
    out, _ = roundtrip(batch, arena, slots)
    assert isinstance(out["pair"], Pair) and torch.equal(out["pair"].image, torch.ones(2, 3))
    assert [s.name for s in out["samples"]] == ["a", "b"]
    assert torch.equal(out["samples"][0].x, torch.arange(4))
    assert out["names"] == ["x", "y"] and out["n"] == 3 and out["nothing"] is None
    assert out["t"][1] == 2.5


def test_non_contiguous_tensor_arrives_with_the_same_values(pool):
    arena, slots = pool
    t = torch.arange(24.0).reshape(4, 6).t()
    out, _ = roundtrip(t, arena, slots)
    assert torch.equal(out, t)


def test_tensor_that_requires_grad_takes_the_ordinary_path(pool):
    arena, slots = pool
    t = torch.ones(3, requires_grad=True)
    out, _enc = roundtrip([t, torch.zeros(2)], arena, slots)
    assert out[0].requires_grad and torch.equal(out[0].detach(), torch.ones(3))
    assert torch.equal(out[1], torch.zeros(2))


def test_batch_without_tensors_uses_no_slot(pool):
    arena, slots = pool
    out, enc = roundtrip({"names": ["a", "b"], "n": [1, 2]}, arena, slots)
    assert out == {"names": ["a", "b"], "n": [1, 2]}
    assert enc.slot is None and not enc.fallback


def test_slot_is_freed_only_when_the_last_view_dies(pool):
    arena, slots = pool
    out, _enc = roundtrip({"a": torch.ones(1000), "b": torch.zeros(10)}, arena, slots)
    assert slots.busy() == 1
    a = out["a"][10:20]  # a view of a view keeps the slot
    del out
    gc.collect()
    assert slots.busy() == 1
    del a
    gc.collect()
    assert slots.busy() == 0


def test_a_kept_batch_is_never_overwritten(pool):
    arena, slots = pool
    kept, _ = roundtrip(torch.full((256,), 7.0), arena, slots)
    for i in range(200):
        out, _ = roundtrip(torch.full((256,), float(i)), arena, slots)
        assert torch.equal(out, torch.full((256,), float(i)))
        del out
    assert torch.equal(kept, torch.full((256,), 7.0))
    # Freed slots were reused: the pool did not grow by one slot per batch.
    assert len(slots) <= 3


def test_pool_grows_for_a_larger_batch_and_retires_small_slots(pool):
    arena, slots = pool
    small, enc1 = roundtrip(torch.ones(10), arena, slots)
    del small
    gc.collect()
    big, enc2 = roundtrip(torch.ones(1 << 20), arena, slots)
    assert enc2.slot != enc1.slot and not enc2.fallback
    assert torch.equal(big, torch.ones(1 << 20))
    assert enc1.slot in arena.take_retired()


def test_batch_over_the_budget_falls_back_to_pickling():
    prefix = new_prefix()
    arena = SlotArena(prefix, 0, budget_bytes=1 << 16)
    slots = SlotMap()
    try:
        out, enc = roundtrip({"x": torch.arange(100_000)}, arena, slots)
        assert enc.fallback and enc.slot is None
        assert torch.equal(out["x"], torch.arange(100_000))
    finally:
        arena.close()
        unlink_owned(prefix)


def test_default_collate_stacks_straight_into_the_slot(collate_into_slots):
    arena, slots = collate_into_slots
    samples = [(torch.full((3, 4), float(i)), i) for i in range(8)]
    arena.reserve(4096)
    arena.begin()
    batch = default_collate(samples)
    assert offset_in_slot(arena, batch[0]) is not None  # written in place, no copy needed
    enc = encode(batch, arena)
    out = decode(enc.payload, enc.slot, slots)
    assert torch.equal(out[0], torch.stack([s[0] for s in samples]))
    assert torch.equal(out[1], torch.arange(8))


def _collate_first_batch(expect: int, budget: int) -> tuple[SlotArena, bool, int, object]:
    """A fresh arena given ``expect``: whether its first batch collated into a slot, the
    slot bytes made before the batch, and the batch as decoded (the arena still open)."""
    prefix = new_prefix()
    arena = SlotArena(prefix, 0, budget_bytes=budget, expect=expect)
    saved = torch_collate.default_collate_fn_map[torch.Tensor]
    _collate.install(arena)
    try:
        arena.prepare()
        made = arena.held_bytes
        arena.begin()
        batch = default_collate([(torch.full((64, 64), float(i)), i) for i in range(8)])
        in_place = offset_in_slot(arena, batch[0]) is not None
        enc = encode(batch, arena)
        slots = SlotMap()
        out = (
            decode(enc.payload, enc.slot, slots) if not enc.fallback else pickle.loads(enc.payload)
        )
        out = (out[0].clone(), out[1].clone())
        slots.clear()
        return arena, in_place, made, out
    finally:
        torch_collate.default_collate_fn_map[torch.Tensor] = saved
        _collate._arena = None
        arena.close()
        unlink_owned(prefix)


EXPECTED = [torch.stack([torch.full((64, 64), float(i)) for i in range(8)]), torch.arange(8)]


def test_an_expected_batch_size_gives_the_first_batch_a_slot_made_beforehand():
    # 8 x 64 x 64 float32 = 128 KiB: a head start's batch of that size said so.
    _, in_place, made, out = _collate_first_batch(expect=(1 << 17) + 8192, budget=64 << 20)
    assert made >= (1 << 17) + 8192  # made by prepare(), before any batch
    assert in_place  # collated straight into it
    assert torch.equal(out[0], EXPECTED[0]) and torch.equal(out[1], EXPECTED[1])


def test_without_an_expected_size_the_first_batch_is_collated_then_copied():
    _, in_place, made, out = _collate_first_batch(expect=0, budget=64 << 20)
    assert made == 0 and not in_place
    assert torch.equal(out[0], EXPECTED[0]) and torch.equal(out[1], EXPECTED[1])


def test_an_expected_size_too_small_or_over_the_budget_still_delivers_the_batch():
    _, in_place, made, out = _collate_first_batch(expect=4096, budget=64 << 20)
    assert made > 0 and not in_place  # the slot made was too small: a larger one is taken
    assert torch.equal(out[0], EXPECTED[0])
    _, in_place, made, out = _collate_first_batch(expect=1 << 20, budget=1 << 16)
    assert made == 0 and not in_place  # over the budget: nothing made, the ordinary path
    assert torch.equal(out[0], EXPECTED[0]) and torch.equal(out[1], EXPECTED[1])


def test_collate_errors_match_torch_for_mismatched_shapes(collate_into_slots):
    arena, _ = collate_into_slots
    arena.reserve(4096)
    arena.begin()
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        default_collate([torch.zeros(2), torch.zeros(3)])


def _nested(values: list[list[float]], dtype: torch.dtype) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "nested tensors are a prototype"
        return torch.nested.nested_tensor([torch.tensor(v, dtype=dtype) for v in values])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16], ids=str)
def test_nested_tensors_survive_behind_other_tensors(pool, dtype):
    """A nested tensor is pickled as its buffer and its components' offsets into the buffer's
    storage: its buffer lies further in the slot than other tensors of the batch, and
    decodes as a view whose storage starts where the buffer does (it read the slot's first
    bytes before)."""
    arena, slots = pool
    rows = [[1, 2, 3], [4, 5], [6]]
    batch = {"ids": torch.arange(5), "nested": _nested(rows, dtype), "again": _nested(rows, dtype)}
    out, enc = roundtrip(batch, arena, slots)
    assert enc.slot is not None and not enc.fallback
    for key in ("nested", "again"):
        assert out[key].is_nested and out[key].dtype == dtype
        assert [t.tolist() for t in out[key].unbind()] == rows
    assert out["ids"].tolist() == list(range(5))
