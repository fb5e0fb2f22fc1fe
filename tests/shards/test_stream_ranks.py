"""ShardStream in a distributed job: each rank's share, equal counts, and how ranks are found.

The real torchrun run is in ``tests/distributed/test_torchrun.py``; here the split is checked
as a property over shard layouts and world sizes, and through real worker processes with an
explicit :class:`stoker.World` per simulated rank.
"""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stoker
from stoker.errors import ConfigError
from stoker.shards import ShardDataset
from stoker.shards._stream import rank_span, split_even


def _samples(spans: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    return [(shard, i) for shard, a, b in spans for i in range(a, b)]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    world_size=st.integers(1, 9),
    workers=st.integers(1, 4),
    pad=st.booleans(),
    data=st.data(),
)
def test_rank_shares_are_equal_contiguous_and_cover_the_epoch(
    sizes: list[int], world_size: int, workers: int, pad: bool, data: st.DataObject
) -> None:
    order = data.draw(st.permutations(range(len(sizes))))
    total = sum(sizes)
    run = [(s, i) for s in order for i in range(sizes[s])]  # the epoch's sample run
    shares = [
        rank_span(sizes, order, stoker.World(r, world_size), pad=pad) for r in range(world_size)
    ]
    count = -(-total // world_size) if pad else total // world_size
    for rank, spans in enumerate(shares):
        got = _samples(spans)
        assert len(got) == count
        # one contiguous stretch of the run, wrapping to its start only when padding
        expected = [run[(rank * count + k) % total] for k in range(count)] if total else []
        assert got == expected
        # the workers' counts are the same on every rank: the same number of batches
        per_worker = [len(_samples(part)) for part in split_even(spans, workers)]
        assert per_worker == [
            count * (w + 1) // workers - count * w // workers for w in range(workers)
        ]
        parts = split_even(spans, workers)
        assert [x for part in parts for x in _samples(part)] == got  # in order, split
    seen = Counter(x for spans in shares for x in _samples(spans))
    if pad:
        assert set(seen) == set(run)  # nothing skipped
        assert sum(seen.values()) - total == count * world_size - total <= world_size - 1
    else:
        assert max(seen.values(), default=1) == 1  # nothing repeated
        assert total - len(seen) == total % world_size


def _key(sample: dict) -> str:
    return sample["__key__"]


def _epoch(loader: stoker.DataLoader) -> list[list[str]]:
    return [list(batch) for batch in loader]


@pytest.mark.parametrize("pad", [True, False])
def test_two_simulated_ranks_with_worker_processes_split_the_epoch(packed: Path, pad: bool) -> None:
    ds = ShardDataset(packed, transform=_key)
    total = len(ds)
    ranks = []
    for rank in range(2):
        stream = ds.stream(buffer_size=3, seed=1, world=stoker.World(rank, 2), pad=pad)
        loader = stoker.DataLoader(
            stream, batch_size=2, num_workers=2, multiprocessing_context="fork", distributed=True
        )
        ranks.append([_epoch(loader), _epoch(loader)])
        assert len(stream) == (-(-total // 2) if pad else total // 2)
    for epoch in range(2):
        a, b = ([key for batch in r[epoch] for key in batch] for r in ranks)
        assert len(ranks[0][epoch]) == len(ranks[1][epoch])  # equal steps
        assert len(a) == len(b) == (-(-total // 2) if pad else total // 2)
        everything = {ds[i] for i in range(total)}
        if pad:
            assert set(a) | set(b) == everything
        else:
            assert not set(a) & set(b)
    assert ranks[0][0] != ranks[0][1]  # a new shard order each epoch


def test_the_world_goes_with_the_stream_to_spawn_workers(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = ShardDataset(packed, transform=_key)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    stream = ds.stream()
    assert stream.current_world() == stoker.World(1, 3, source="environment")
    sent = pickle.dumps(stream)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert stream.current_world().world_size == 1
    received = pickle.loads(sent)  # a worker that cannot see its parent's process group
    assert received.current_world() == stoker.World(1, 3, source="environment")
    assert len(received) == -(-len(ds) // 3)
    # an explicit single world reads everything, whatever the job
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert len(ds.stream(world=stoker.World())) == len(ds)


def test_stream_arguments_are_checked(packed: Path) -> None:
    ds = ShardDataset(packed)
    with pytest.raises(ConfigError, match=r"`world` must be a stoker.World.*Found: 2"):
        ds.stream(world=2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"`pad` must be True or False. Found: 'yes'"):
        ds.stream(pad="yes")  # type: ignore[arg-type]
