"""Relations between a batch's tensors survive the slot: identity, aliasing and layout.

torch's worker path shares each tensor's storage, so a batch arrives with the same object
where it had the same object, views that still alias their base, and the strides it was built
with. The codec places copies in a slot instead; these tests check that it keeps those
relations, first through ``encode``/``decode`` in one process, then end to end against torch's
own DataLoader with worker processes.
"""

from __future__ import annotations

import gc
import itertools
import os
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from _codec_support import offset_in_slot, roundtrip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import default_collate

import stoker
from stoker.transport import decode, encode
from stoker.transport._codec import _DTYPES

# Workers in a test whose failure mode is a hang get this long.
HANG_GUARD_S = 120
EXAMPLES = int(os.environ.get("STOKER_HYPOTHESIS_EXAMPLES", "100"))


def values(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A contiguous tensor of distinct small values, exact in every dtype."""
    numel = 1
    for n in shape:
        numel *= n
    t = torch.arange(numel).remainder(97).add(1).reshape(shape)
    if dtype == torch.bool:
        return t.remainder(2).bool()
    if dtype.is_complex:
        return torch.complex(t.float(), -t.float()).to(dtype)
    return t.to(dtype)


def raw(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values as bytes, in logical order (conjugate and negative bits applied)."""
    flat = t.resolve_conj().resolve_neg().flatten().clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def addresses(t: torch.Tensor) -> torch.Tensor:
    """The byte address of every element of ``t``, in logical order."""
    offsets = torch.zeros(t.shape, dtype=torch.int64)
    for dim, (n, stride) in enumerate(zip(t.shape, t.stride(), strict=True)):
        shape = [1] * t.dim()
        shape[dim] = n
        offsets = offsets + torch.arange(n).mul(stride).view(shape)
    return (t.data_ptr() + offsets * t.element_size()).reshape(-1)


def is_dense(t: torch.Tensor) -> bool:
    """Whether the elements cover one block of memory, each byte once (no gap, no overlap)."""
    slots = (addresses(t) - t.data_ptr()).div(t.element_size(), rounding_mode="floor")
    return torch.equal(slots.sort().values, torch.arange(t.numel()))


def sharing(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """For every pair of tensors, which of their elements lie at the same address."""
    addr = [addresses(t) for t in tensors]
    return [a[:, None] == b[None, :] for a, b in itertools.product(addr, repeat=2)]


def assert_same_sharing(want: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    for i, (w, g) in enumerate(zip(sharing(want), sharing(got), strict=True)):
        assert torch.equal(w, g), f"pair {divmod(i, len(want))} shares other elements"


# -- identity ----------------------------------------------------------------------------------


def test_an_object_twice_in_a_batch_decodes_to_one_object(pool):
    arena, slots = pool
    x = torch.arange(6.0).reshape(2, 3)
    t = x.t()  # not contiguous
    scalar = torch.tensor(3)
    empty = torch.zeros(2, 0)
    arr = np.arange(5)
    batch = {"a": [x, t, scalar, empty, arr], "b": (x, t, scalar, empty, arr), "c": {"x": x}}
    out, enc = roundtrip(batch, arena, slots)
    assert enc.slot is not None and not enc.fallback
    for got_a, got_b in zip(out["a"], out["b"], strict=True):
        assert got_a is got_b
    assert out["c"]["x"] is out["a"][0]
    # ... and still to different objects where the batch had different ones.
    assert len({id(o) for o in out["a"]}) == len(batch["a"])
    assert torch.equal(out["a"][1], t) and np.array_equal(out["a"][4], arr)


def test_equal_views_that_are_different_objects_stay_different(pool):
    arena, slots = pool
    x = torch.arange(4.0)
    out, _ = roundtrip([x, x[:], x.view(4)], arena, slots)
    assert out[0] is not out[1] and out[1] is not out[2]
    out[1].add_(10)
    assert torch.equal(out[0], x + 10) and torch.equal(out[2], x + 10)


# -- aliasing ----------------------------------------------------------------------------------


def test_views_of_one_storage_alias_after_decoding(pool):
    arena, slots = pool
    storage = torch.arange(30.0)
    x = storage[4:24]  # the batch does not hold the whole storage
    batch = {"x": x, "head": x[:4], "tail": x[15:], "grid_t": x.view(4, 5).t(), "step": x[::3]}
    out, enc = roundtrip(batch, arena, slots)
    assert not enc.fallback
    for name, want in batch.items():
        assert torch.equal(out[name], want) and out[name].stride() == want.stride(), name
    assert_same_sharing(list(batch.values()), list(out.values()))
    out["x"].mul_(-1)
    for name, want in batch.items():
        assert torch.equal(out[name], -want), f"{name} does not see the change made to x"


def test_aliases_of_other_dtypes_and_conjugates_share_the_same_bytes(pool):
    arena, slots = pool
    x = torch.arange(8.0)
    z = torch.complex(torch.arange(4.0), torch.arange(4.0) + 10)
    batch = {"x": x, "bits": x.view(torch.int32), "z": z, "zc": z.conj(), "neg": z.conj().imag}
    assert batch["zc"].is_conj() and batch["neg"].is_neg()
    out, _ = roundtrip(batch, arena, slots)
    for name, want in batch.items():
        assert out[name].dtype == want.dtype and torch.equal(raw(out[name]), raw(want)), name
    out["x"][0] = 0.5
    assert out["bits"][0] == torch.tensor(0.5).view(torch.int32)
    out["z"][1] = 7 + 8j
    assert out["zc"][1] == 7 - 8j and out["neg"][1] == -8


def test_tensors_of_one_storage_that_do_not_overlap_are_placed_apart(pool, tight_arena):
    _, slots = pool
    big = torch.arange(float(1 << 20))  # 4 MiB: more than the arena may hold
    first, last = big[:100], big[-100:]
    out, enc = roundtrip([first, last], tight_arena, slots)
    assert not enc.fallback
    assert torch.equal(out[0], first) and torch.equal(out[1], last)


def test_sparse_aliases_of_a_large_storage_are_copied_one_by_one(pool, tight_arena):
    """Two columns of a large matrix overlap in range but hold few bytes: no span copy."""
    _, slots = pool
    big = torch.arange(float(1 << 20)).reshape(1024, 1024)  # 4 MiB
    cols = [big[:, 0], big[:, 1]]
    out, enc = roundtrip(cols, tight_arena, slots)
    assert not enc.fallback  # the 4 MiB span would not have fit
    for got, want in zip(out, cols, strict=True):
        assert torch.equal(got, want) and got.is_contiguous()


def test_a_batch_with_many_views_needs_only_its_span(pool, tight_arena):
    """``needed`` counts one copy of the span, not one per view: it fits a tight budget."""
    _, slots = pool
    x = torch.arange(float(1 << 18))  # 1 MiB
    views = [x[i * 1000 :] for i in range(40)]  # ~40 MiB if each were copied
    out, enc = roundtrip([x, *views], tight_arena, slots)
    assert not enc.fallback
    out[0].zero_()
    assert all(not v.any() for v in out[1:])


# -- layout ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: values(torch.float32, (2, 3, 4, 5)).contiguous(memory_format=torch.channels_last),
        lambda: values(torch.uint8, (2, 3, 2, 4, 5)).contiguous(
            memory_format=torch.channels_last_3d
        ),
        lambda: values(torch.int64, (3, 4, 5)).permute(2, 0, 1),
        lambda: values(torch.float16, (6, 7)).t(),
        lambda: values(torch.float32, (4, 3, 5, 5)).contiguous(memory_format=torch.channels_last)[
            1
        ],  # with a storage offset
        lambda: values(torch.complex64, (3, 4)).t().conj(),
    ],
    ids=["channels_last", "channels_last_3d", "permuted", "transposed", "offset", "conj"],
)
def test_dense_layouts_keep_their_strides(pool, make):
    arena, slots = pool
    t = make()
    out, _ = roundtrip({"t": t}, arena, slots)
    assert out["t"].stride() == t.stride() and torch.equal(raw(out["t"]), raw(t))


@pytest.mark.parametrize(
    "make",
    [
        lambda: values(torch.float32, (4, 6))[:, ::2],
        lambda: values(torch.int32, (5, 5))[1:4, 1:4],
        lambda: values(torch.float64, (3,)).expand(4, 3),
    ],
    ids=["stepped", "cropped", "expanded"],
)
def test_a_gapped_or_overlapping_layout_alone_arrives_contiguous(pool, make):
    arena, slots = pool
    t = make()
    out, _ = roundtrip(t, arena, slots)
    assert out.is_contiguous() and torch.equal(out, t)


# -- tensors collation wrote into the slot ------------------------------------------------------


def test_views_of_a_collated_tensor_are_decoded_in_place(collate_into_slots):
    arena, slots = collate_into_slots
    arena.reserve(1 << 16)
    arena.begin()
    batch = default_collate([values(torch.float32, (3, 4, 4)) for _ in range(4)])
    offset = offset_in_slot(arena, batch)
    assert offset is not None
    views = [batch, batch.permute(0, 2, 3, 1), batch[:, 0], batch[1:3]]
    enc = encode(views, arena)
    buf = slots.open(enc.slot)
    out = decode(enc.payload, enc.slot, slots, buf)
    base = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    assert out[0].data_ptr() - base == offset  # not copied
    for got, want in zip(out, views, strict=True):
        assert got.stride() == want.stride() and torch.equal(got, want)
    assert_same_sharing(views, out)


def test_a_slot_partly_taken_by_discarded_collation_output_is_not_overwritten(
    collate_into_slots,
):
    """The batch overflows its slot, and reserving gives the same slot back: take another."""
    arena, slots = collate_into_slots
    arena.reserve(1 << 20)  # slots of ~1.25 MiB from now on
    arena.begin()
    assert arena.alloc(600_000) is not None  # collated, then dropped by the user's collate_fn
    labels = default_collate(list(range(1000)))  # ints: not collated into the slot
    kept = default_collate([torch.full((10,), 7.0)] * 8)  # 320 B, in the slot
    assert offset_in_slot(arena, kept) is not None
    fresh = torch.full((200_000,), 3.0)  # 800 KB: overflows; the batch needs ~0.8 MiB
    taken = arena.current.name
    enc = encode([kept, fresh, labels], arena)
    assert not enc.fallback and enc.slot != taken
    got = decode(enc.payload, enc.slot, slots)
    assert torch.equal(got[0], torch.full((8, 10), 7.0))
    assert torch.equal(got[1], fresh) and torch.equal(got[2], torch.arange(1000))


# -- property: random views of a random layout ---------------------------------------------------


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[Any], list[int]]:
    """A base tensor of random dtype, shape, dimension order and storage offset, some views
    of it (slices with steps, transposes, conjugates), perhaps a lone view of another tensor,
    in random order with repeats. Returns the batch and the positions of lone tensors."""
    dtype = draw(st.sampled_from(_DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    order = draw(st.permutations(range(len(shape))))
    pad = draw(st.integers(0, 5))
    numel = 1
    for n in shape:
        numel *= n
    storage = values(dtype, (pad + numel,))
    base = storage[pad:].view(shape).permute(order)

    def view_of(t: torch.Tensor) -> torch.Tensor:
        empty = t.dim() > 0 and draw(st.integers(0, 7)) == 0  # now and then no elements
        index = []
        for n in t.shape:
            start = draw(st.integers(0, n - 1))
            stop = start if empty else n - draw(st.integers(0, n - 1 - start))
            index.append(slice(start, stop, draw(st.sampled_from((1, 2, 3)))))
            empty = False
        v = t[tuple(index)]
        if v.dim() >= 2 and draw(st.booleans()):
            v = v.transpose(0, v.dim() - 1)
        if dtype.is_complex and draw(st.booleans()):
            v = v.conj()
        return v

    items = [base] + [view_of(base) for _ in range(draw(st.integers(0, 3)))]
    lone = []
    if draw(st.booleans()):
        other = values(dtype, tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))))
        lone = [view_of(other)]
    repeats = draw(st.lists(st.sampled_from(items), max_size=2))
    batch = draw(st.permutations(items + lone + repeats))
    return batch, [i for i, t in enumerate(batch) if any(t is x for x in lone)]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=batches())
def test_random_views_keep_values_identity_layout_and_aliasing(pool, case):
    batch, lone = case
    arena, slots = pool
    out, enc = roundtrip(batch, arena, slots)
    assert not enc.fallback
    for i, (got, want) in enumerate(zip(out, batch, strict=True)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(raw(got), raw(want))
        if i not in lone or want.numel() == 0 or is_dense(want):
            assert got.stride() == want.stride()
        else:
            assert got.is_contiguous()
        for j, other in enumerate(batch):
            assert (out[j] is got) == (other is want)
    related = [i for i in range(len(batch)) if i not in lone]
    assert_same_sharing([batch[i] for i in related], [out[i] for i in related])
    del out
    gc.collect()


# -- end to end: stoker's process workers against torch's ----------------------------------------


class ViewsDataset(tud.Dataset[dict[str, Any]]):
    """Samples whose tensors are views of one storage, the same object twice, and an image
    in channels_last."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, Any]:
        storage = torch.arange(24.0) + 100 * i
        x = storage[2:22]
        image = (torch.arange(48.0) + i).view(1, 3, 4, 4)
        return {
            "x": x,
            "again": x,
            "head": x[:4],
            "grid_t": x.view(4, 5).t(),
            "pair": (x, x[5:]),
            "image": image.contiguous(memory_format=torch.channels_last),
            "id": i,
        }


def keep_samples(samples: list[Any]) -> list[Any]:
    return samples


def _relations(sample: dict[str, Any]) -> dict[str, Any]:
    """What a sample's consumer can observe: identity, strides, and aliasing after a write."""
    seen = {
        "same": sample["x"] is sample["again"] is sample["pair"][0],
        "strides": {k: v.stride() for k, v in sample.items() if isinstance(v, torch.Tensor)},
        "before": {k: v.tolist() for k, v in sample.items() if isinstance(v, torch.Tensor)},
        "channels_last": sample["image"].is_contiguous(memory_format=torch.channels_last),
    }
    sample["x"].mul_(-1)
    seen["after"] = {
        "head": sample["head"].tolist(),
        "grid_t": sample["grid_t"].tolist(),
        "tail": sample["pair"][1].tolist(),
    }
    return seen


def _observe(loader: tud.DataLoader[Any]) -> list[Any]:
    out = []
    for batch in loader:
        samples = batch if isinstance(batch, list) else [batch]
        out.append([_relations(s) for s in samples])
    return out


@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize(
    "kwargs",
    [{"batch_size": None}, {"batch_size": 2, "collate_fn": keep_samples}],
    ids=["batch_size=None", "custom_collate"],
)
def test_process_workers_deliver_the_relations_torch_delivers(kwargs):
    ds = ViewsDataset()
    want = _observe(tud.DataLoader(ds, num_workers=2, multiprocessing_context="fork", **kwargs))
    got = _observe(stoker.DataLoader(ds, num_workers=2, multiprocessing_context="fork", **kwargs))
    assert got == want
    first = want[0][0]
    assert first["same"] and first["channels_last"]
    assert first["after"]["head"] == [-v for v in first["before"]["head"]]
