"""ShardDataset: access, decoding, corruption reports, streaming, and loaders with workers."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import stoker
from stoker.errors import ConfigError
from stoker.shards import CorruptShardError, ShardDataset, ShardStream, _stream, read_index
from stoker.shards._stream import assign_spans


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_raw_fields_are_zero_copy_views_of_the_shard(packed: Path) -> None:
    ds = ShardDataset(packed)
    sample = ds.raw(5)
    assert isinstance(sample["jpg"], memoryview) and sample["jpg"].readonly
    assert ds[5]["jpg"] == bytes(sample["jpg"]) and type(ds[5]["jpg"]) is bytes
    shard = read_index(packed).shards[ds.locate(5)[0]]
    ext, offset, size = shard.members(ds.locate(5)[1])[1]
    assert ext == "jpg"
    assert bytes(sample["jpg"]) == (packed / shard.name).read_bytes()[offset : offset + size]
    assert ds[-1]["__key__"] == ds[len(ds) - 1]["__key__"]
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
    del sample
    ds.close()


def test_decoders_and_fields(packed: Path) -> None:
    image, label = ShardDataset(packed, decode="torch", fields=("jpg;png", "cls"))[7]
    assert image.dtype == torch.uint8 and image.shape[0] == 3 and isinstance(label, int)
    pil = ShardDataset(packed, decode="pil")[7]["jpg"]
    assert pil.size == (image.shape[2], image.shape[1])
    mapped = ShardDataset(packed, decode={"jpg": len})[7]
    assert mapped["jpg"] > 100 and mapped["cls"] == label
    called = ShardDataset(packed, decode=lambda s: s["__key__"], transform=str.upper)[7]
    assert called == ShardDataset(packed)[7]["__key__"].upper()
    with pytest.raises(KeyError, match="has no field 'png'"):
        ShardDataset(packed, decode="bytes", fields=("png",))[0]
    with pytest.raises(ConfigError, match="`decode` must be"):
        ShardDataset(packed, decode="jpeg")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`verify` must be one of"):
        ShardDataset(packed, verify="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize("verify", ["full", "lazy", "off"])
def test_truncated_shard_names_shard_and_offset(packed: Path, verify: str) -> None:
    shard = read_index(packed).shards[1]
    path = packed / shard.name
    cut = int(shard.offsets[2]) + 10
    path.write_bytes(path.read_bytes()[:cut])
    if verify == "full":
        with pytest.raises(CorruptShardError) as info:
            ShardDataset(packed, verify="full")
    else:
        ds = ShardDataset(packed, verify=verify)  # type: ignore[arg-type]
        ds[0]  # shard 0 is intact
        with pytest.raises(CorruptShardError) as info:
            ds[ds.shard_range(1).start]
    assert info.value.shard == str(path) and info.value.offset == cut
    assert f"byte offset {cut}" in str(info.value) and shard.name in str(info.value)
    assert "truncated" in str(info.value)


@pytest.mark.parametrize("verify", ["full", "lazy"])
def test_flipped_byte_names_shard_and_offset(packed: Path, verify: str) -> None:
    shard = read_index(packed).shards[2]
    path = packed / shard.name
    bad = int(shard.offsets[3]) + 7
    _flip(path, bad)
    if verify == "full":
        with pytest.raises(CorruptShardError) as info:
            ShardDataset(packed, verify="full")
    else:
        ds = ShardDataset(packed, verify="lazy")
        ds[ds.shard_range(1).start]
        with pytest.raises(CorruptShardError) as info:
            ds[ds.shard_range(2).stop - 1]
    err = info.value
    assert err.shard == str(path) and err.offset <= bad < err.offset + shard.chunk_size
    assert shard.name in str(err) and f"byte offset {err.offset}" in str(err)
    assert "stoker index" in str(err)
    # The error crosses a process boundary with its attributes.
    again = pickle.loads(pickle.dumps(err))
    assert (again.shard, again.offset, str(again)) == (err.shard, err.offset, str(err))


def test_flipped_byte_goes_unnoticed_with_verify_off(packed: Path) -> None:
    shard = read_index(packed).shards[0]
    _flip(packed / shard.name, int(shard.offsets[1]) + 3)
    assert len(bytes(ShardDataset(packed, verify="off")[0]["jpg"])) == int(shard.sizes[1])


def test_pickles_without_its_maps(packed: Path) -> None:
    ds = ShardDataset(packed, decode="bytes")
    first = ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._reader._maps == {} and clone[0] == first
    ds.close()
    clone.close()


def _keys(batches) -> list[str]:
    return [k for batch in batches for k in batch]


def _key_only(sample: dict) -> str:
    return sample["__key__"]


@pytest.mark.parametrize(
    ("loader_cls", "context"),
    [(tud.DataLoader, "fork"), (tud.DataLoader, "spawn"), (stoker.DataLoader, "fork")],
    ids=["torch-fork", "torch-spawn", "stoker-fork"],
)
def test_loaders_with_two_workers(packed: Path, loader_cls: type, context: str) -> None:
    ds = ShardDataset(packed, decode="torch", fields=("jpg", "cls"), transform=_resize)
    loader = loader_cls(
        ds, batch_size=4, num_workers=2, multiprocessing_context=context, persistent_workers=False
    )
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
    reference = [ds[i] for i in range(len(ds))]
    assert torch.equal(torch.cat(images), torch.stack([r[0] for r in reference]))
    assert torch.cat(labels).tolist() == [r[1] for r in reference]


def _resize(sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int]:
    image, label = sample
    return image[:, :16, :16].float().div(255), label


def test_stream_yields_every_sample_once_per_epoch(packed: Path) -> None:
    ds = ShardDataset(packed, decode="bytes")
    stream = ds.stream(buffer_size=4, seed=3)
    assert isinstance(stream, ShardStream)
    everything = sorted(ds[i]["__key__"] for i in range(len(ds)))
    epoch0 = [s["__key__"] for s in stream]
    epoch1 = [s["__key__"] for s in stream]
    assert sorted(epoch0) == sorted(epoch1) == everything
    assert epoch0 != epoch1
    stream.set_epoch(0)
    assert [s["__key__"] for s in stream] == epoch0
    ordered = [s["__key__"] for s in ds.stream(shuffle=False)]
    assert ordered == [ds[i]["__key__"] for i in range(len(ds))]
    with pytest.raises(ConfigError, match="`buffer_size`"):
        ds.stream(buffer_size=0)


def test_stream_buffer_yields_before_it_is_full_and_fills_as_it_yields(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = 2
    monkeypatch.setattr(_stream, "FIRST_YIELD_SAMPLES", first)
    ds = ShardDataset(packed, decode="bytes")
    reads: list[int] = []
    buffered = ds.buffered
    monkeypatch.setattr(ds, "buffered", lambda i: reads.append(i) or buffered(i))
    n, size = len(ds), 6
    fill = first + 2 * (size - first) + 1  # read when the buffer first yields at its full size
    assert n > fill + 1  # so the buffer fills before the epoch ends
    read_before = []  # samples read when each sample was yielded
    keys = []
    for sample in ds.stream(buffer_size=size, seed=1):
        read_before.append(len(reads))
        keys.append(sample["__key__"])
    # The first comes once 2 are held (the 3rd read swaps one out), then two in for each out
    # until 6 are held, then one in for each out.
    assert read_before[:3] == [3, 5, 7]
    assert read_before[size - first] == fill and read_before[size - first + 1] == fill + 1
    assert sorted(keys) == sorted(ds[i]["__key__"] for i in range(n)) and len(reads) == n


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_stream_splits_shards_across_workers(packed: Path, context: str) -> None:
    ds = ShardDataset(packed, transform=_key_only)
    loader = tud.DataLoader(
        ds.stream(buffer_size=3), batch_size=2, num_workers=2, multiprocessing_context=context
    )
    keys = _keys(loader)
    assert sorted(keys) == sorted(ds[i] for i in range(len(ds)))


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 16])
def test_assign_spans_covers_every_sample_once_and_balances(workers: int) -> None:
    sizes = [5, 1, 7, 3, 3, 9]
    order = [4, 0, 5, 1, 3, 2]
    spans = assign_spans(sizes, order, workers)
    covered = sorted((s, i) for w in spans for s, a, b in w for i in range(a, b))
    assert covered == sorted((s, i) for s, n in enumerate(sizes) for i in range(n))
    loads = [sum(b - a for _, a, b in w) for w in spans]
    if workers <= len(sizes):
        assert max(loads) - min(loads) <= max(sizes)
        assert all(b - a == sizes[s] for w in spans for s, a, b in w)  # whole shards
    else:
        assert max(loads) - min(loads) <= 1
    assert np.sum(loads) == sum(sizes)


@pytest.mark.parametrize(
    ("make_loader", "workers"),
    [(tud.DataLoader, 0), (tud.DataLoader, 2), (stoker.DataLoader, 2)],
    ids=["torch-0", "torch-2", "stoker-2"],
)
def test_default_fields_batch_with_the_default_collate(
    packed: Path, make_loader: type[tud.DataLoader[Any]], workers: int
) -> None:
    # Issue 31: with zero-copy memoryviews by default, this failed in torch's collate ("each
    # element in list of batch should be of equal size"), and views do not pickle out of a worker.
    ds = ShardDataset(packed)
    loader = make_loader(ds, batch_size=4, num_workers=workers)
    batches = list(loader)
    assert len(batches) == -(-len(ds) // 4)
    first = batches[0]
    assert first["__key__"] == [ds.raw(i)["__key__"] for i in range(4)]
    assert first["jpg"] == [bytes(ds.raw(i)["jpg"]) for i in range(4)]
    assert first["cls"] == [bytes(ds.raw(i)["cls"]) for i in range(4)]
    del loader
    ds.close()
