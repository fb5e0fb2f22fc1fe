"""``stoker.DataLoader(..., distributed=True)`` in one process: ranks simulated through
torchrun's environment variables (no process group, so no fingerprint exchange)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.utils.data as tud

from stoker import DataLoader
from stoker.errors import ConfigError
from stoker.loader._distributed import check_fingerprints
from stoker.sampling import RankSampler

N = 29
BATCH = 4


class Stream(tud.IterableDataset[int]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from range(3)


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_RANK", str(rank))


def _loader(**kwargs: object) -> DataLoader:
    return DataLoader(torch.arange(N), batch_size=BATCH, shuffle=True, distributed=True, **kwargs)  # type: ignore[arg-type]


def _take(loader: DataLoader, steps: int | None = None) -> list[int]:
    out: list[int] = []
    it = iter(loader)
    while steps is None or len(out) < steps * BATCH:
        try:
            out += next(it).tolist()
        except StopIteration:
            break
    return out


def test_default_sampler_becomes_rank_sampler_and_pads(monkeypatch: pytest.MonkeyPatch) -> None:
    shares = []
    for rank in range(2):
        _as_rank(monkeypatch, rank, 2)
        loader = _loader()
        assert isinstance(loader.sampler, RankSampler)
        assert loader.sampler.pad and loader.sampler.shuffle
        assert len(loader) == 4  # ceil(15 / 4)
        shares.append(_take(loader))
    assert len(shares[0]) == len(shares[1]) == 15
    counts = Counter(shares[0] + shares[1])
    assert set(counts) == set(range(N)) and sum(counts.values()) == N + 1


def test_drop_last_drops_instead_of_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_rank(monkeypatch, 1, 2)
    loader = _loader(drop_last=True)
    assert not loader.sampler.pad  # type: ignore[attr-defined]
    assert len(_take(loader)) == 12  # 14 per rank, 3 full batches


def test_epochs_follow_the_loader_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_rank(monkeypatch, 0, 2)
    loader = _loader()
    first, second = _take(loader), _take(loader)
    assert first != second
    loader.set_epoch(0)  # explicit set_epoch wins: epoch 0's order again
    assert _take(loader) == first


@pytest.mark.parametrize(("saved", "resumed"), [(2, 1), (1, 2), (2, 3)])
def test_elastic_resume_through_the_loader(
    monkeypatch: pytest.MonkeyPatch, saved: int, resumed: int
) -> None:
    seen: list[int] = []
    for rank in range(saved):
        _as_rank(monkeypatch, rank, saved)
        loader = _loader()
        _take(loader)  # epoch 0 in full
        seen += _take(loader, steps=2)  # two steps of epoch 1
        if rank == 0:
            state = loader.state_dict()
    rest: list[list[int]] = []
    for rank in range(resumed):
        _as_rank(monkeypatch, rank, resumed)
        loader = _loader()
        loader.load_state_dict(state)
        rest.append(_take(loader))
    assert len({len(r) for r in rest}) == 1  # equal steps after the resume
    counts = Counter(seen + [i for r in rest for i in r])
    assert set(counts) == set(range(N))
    assert sum(counts.values()) - N < resumed  # only the new world's padding repeats


def test_same_world_resume_keeps_per_batch_skipping(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_rank(monkeypatch, 1, 2)
    loader = _loader()
    full = _take(_loader())
    head = _take(loader, steps=2)
    state = loader.state_dict()
    again = _loader()
    again.load_state_dict(state)
    assert head + _take(again) == full  # the exact uninterrupted sequence


def test_gaps_in_delivered_batches_cannot_change_world(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_rank(monkeypatch, 0, 2)
    loader = _loader()
    _take(loader, steps=1)
    state = loader.state_dict()
    state["delivered"] = {"prefix": 1, "rest": [3]}
    state["sampler"]["world_size"] = 3
    with pytest.raises(ConfigError, match="have gaps, as `in_order=False` allows"):
        _loader().load_state_dict(state)


def test_user_distributed_sampler_is_kept_and_driven(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = tud.DistributedSampler(torch.arange(N), num_replicas=2, rank=0, seed=1)
    loader = DataLoader(torch.arange(N), batch_size=BATCH, sampler=sampler, distributed=True)
    first = _take(loader)
    with pytest.warns(UserWarning, match=r"calls `set_epoch\(1\)` on your DistributedSampler"):
        second = _take(loader)
    assert sampler.epoch == 1 and first != second
    sampler.set_epoch(7)  # the user takes over: stoker stops calling it
    _take(loader)
    assert sampler.epoch == 7


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_sampler": tud.BatchSampler(range(4), 2, False), "batch_size": 1}, "batch_sampler"),
        ({"sampler": tud.SequentialSampler(range(4))}, "not rank-aware"),
        ({"distributed": "yes"}, "`distributed` must be True or False"),
    ],
)
def test_config_errors(kwargs: dict[str, object], match: str) -> None:
    kwargs = {"distributed": True, **kwargs}
    with pytest.raises(ConfigError, match=match):
        DataLoader(list(range(4)), **kwargs)  # type: ignore[arg-type]


def test_iterable_dataset_is_refused() -> None:
    with pytest.raises(ConfigError, match="Stream is an IterableDataset"):
        DataLoader(Stream(), distributed=True)


def test_fingerprint_mismatch_message_names_ranks_and_values() -> None:
    base = {"dataset length": 10, "batch_size": 4, "seed": 0, "drop_last": False, "shuffle": True}
    check_fingerprints([base, dict(base)])
    odd = dict(base, **{"dataset length": 11, "seed": 3})
    with pytest.raises(ConfigError) as info:
        check_fingerprints([base, odd, dict(base)])
    text = str(info.value)
    assert "dataset length: ranks 0, 2 = 10; rank 1 = 11" in text
    assert "seed: ranks 0, 2 = 0; rank 1 = 3" in text
    assert "batch_size" not in text.split("\n")[1:-1]
