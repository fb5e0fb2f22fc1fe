"""device="cuda": run on a machine with an NVIDIA GPU (`pytest -m gpu`); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

import stoker

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_initialized")]


class Pattern(Dataset):
    """uint8 images whose every element is a function of (index, position)."""

    def __init__(self, n: int = 256, shape: tuple[int, ...] = (3, 64, 64)) -> None:
        self.n, self.shape = n, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        numel = 1
        for s in self.shape:
            numel *= s
        x = (torch.arange(numel, dtype=torch.int64) * 31 + i * 7) % 251
        return x.to(torch.uint8).view(self.shape), i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_element_arrives_on_the_device(num_workers):
    ds = Pattern()
    loader = stoker.DataLoader(ds, batch_size=16, num_workers=num_workers, device="cuda")
    seen = 0
    for x, idx in loader:
        assert x.is_cuda and idx.is_cuda
        want = torch.stack([ds[int(i)][0] for i in idx.cpu()]).cuda()
        assert torch.equal(x, want)
        seen += len(idx)
    assert seen == len(ds)


def test_consumer_modifying_batches_in_place_does_not_corrupt_later_ones():
    ds = Pattern(512)
    loader = stoker.DataLoader(ds, batch_size=32, num_workers=2, device="cuda")
    seen = 0
    for x, idx in loader:
        # Each batch must still hold the dataset's values when it arrives, whatever the
        # consumer did in place to the batches before it.
        want = torch.stack([ds[int(i)][0] for i in idx.cpu()]).cuda()
        assert torch.equal(x, want)
        seen += len(idx)
        # In-place work on the consumer stream, racing the side stream's next copies.
        x.zero_()
        torch.cuda._sleep(1_000_000)
        x.add_(1)
        assert int(x.min()) == 1 and int(x.max()) == 1
    torch.cuda.synchronize()
    assert seen == len(ds)


def test_slots_are_not_reused_while_a_copy_is_in_flight():
    ds = Pattern(2048, (3, 128, 128))
    loader = stoker.DataLoader(ds, batch_size=64, num_workers=2, device="cuda", prefetch_factor=1)
    seen = 0
    for x, idx in loader:
        want = torch.stack([ds[int(i)][0] for i in idx.cpu()]).cuda()
        assert torch.equal(x, want)
        seen += len(idx)
    assert seen == len(ds)  # an empty loader must not pass


def test_device_memory_does_not_grow_over_1000_batches():
    ds = Pattern(64 * 4, (3, 32, 32))
    loader = stoker.DataLoader(ds, batch_size=64, num_workers=2, device="cuda")
    batches = 0
    baseline = None
    batch_bytes = 64 * 3 * 32 * 32
    while batches < 1000:
        for _x, _ in loader:
            batches += 1
            if batches == 50:
                torch.cuda.synchronize()
                baseline = torch.cuda.memory_allocated()
    torch.cuda.synchronize()
    assert baseline is not None
    assert torch.cuda.memory_allocated() <= baseline + 4 * batch_bytes


def test_slots_are_registered_as_page_locked():
    loader = stoker.DataLoader(Pattern(64), batch_size=16, num_workers=2, pin_memory=True)
    x, _ = next(iter(loader))
    assert x.is_pinned()  # a view of a registered slot, not a staged copy


@pytest.mark.parametrize("num_workers", [0, 2])
def test_copies_queued_behind_the_consumer_survive_the_epoch_boundary(num_workers):
    """A copy issued behind the consumer's queued work can outlive its epoch: the next epoch
    must not refill (or free) the host batch under it. `stoker bench --device cuda` read
    labels out of range here before the next epoch kept the last epoch's host batches."""
    ds = Pattern(96, (3, 64, 64))
    loader = stoker.DataLoader(ds, batch_size=32, num_workers=num_workers, device="cuda")
    kept = []
    for _epoch in range(4):
        for x, idx in loader:
            torch.cuda._sleep(20_000_000)  # consumer work; the next copies queue behind it
            kept.append((x, idx))
    torch.cuda.synchronize()
    assert len(kept) == 12
    for b, (x, idx) in enumerate(kept):
        first = (b % 3) * 32
        assert idx.cpu().tolist() == list(range(first, first + 32)), b
        want = torch.stack([ds[i][0] for i in range(first, first + 32)]).cuda()
        assert torch.equal(x, want), b


def test_the_head_starts_first_batch_arrives_on_the_device(monkeypatch):
    """backend="auto": the batch loaded beside the probe (stoker.loader._head, forced here
    for any batch) goes through the device stage like a worker's, copied ahead."""
    import stoker.loader._head as head_mod

    monkeypatch.setattr(head_mod, "HEAD_MIN_BATCH_S", 0.0)
    ds = Pattern(128)
    loader = stoker.DataLoader(ds, batch_size=16, num_workers=2, backend="auto", device="cuda")
    seen = []
    for x, idx in loader:
        assert x.is_cuda and idx.is_cuda
        want = torch.stack([ds[int(i)][0] for i in idx.cpu()]).cuda()
        assert torch.equal(x, want)
        seen.extend(int(i) for i in idx.cpu())
    assert seen == list(range(len(ds)))
    assert any("first batch loaded beside the backend probe" in n for n in loader.stats().notes)
