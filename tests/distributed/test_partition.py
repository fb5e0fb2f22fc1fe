"""Hypothesis properties of the rank partition and of RankSampler (in one process, each rank
simulated by a ``World``)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.errors import ConfigError
from stoker.sampling import RankSampler, World, partition, rank_positions
from stoker.sampling._partition import consume

lengths = st.integers(min_value=0, max_value=300)
worlds = st.integers(min_value=1, max_value=64)
layouts = st.sampled_from(["interleave", "block"])


@settings(max_examples=150, deadline=None)
@given(length=lengths, world=worlds, layout=layouts)
def test_pad_gives_equal_shares_covering_everything(length: int, world: int, layout: str) -> None:
    shares = partition(length, world, pad=True, layout=layout)  # type: ignore[arg-type]
    share = -(-length // world)
    assert [len(s) for s in shares] == [share] * world
    counts = Counter(int(p) for s in shares for p in s)
    assert set(counts) == set(range(length))  # every position, including length < world
    assert sum(counts.values()) - length == share * world - length < max(world, 1)
    if counts:  # repeats are spread: no position is seen more than once more than another
        assert max(counts.values()) - min(counts.values()) <= 1


@settings(max_examples=150, deadline=None)
@given(length=lengths, world=worlds, layout=layouts)
def test_drop_gives_equal_disjoint_shares(length: int, world: int, layout: str) -> None:
    shares = partition(length, world, pad=False, layout=layout)  # type: ignore[arg-type]
    share = length // world
    assert [len(s) for s in shares] == [share] * world
    flat = [int(p) for s in shares for p in s]
    assert len(flat) == len(set(flat))  # disjoint
    assert set(flat) == set(range(share * world))  # only the last length % world are dropped
    assert length - len(flat) < world


@settings(max_examples=100, deadline=None)
@given(length=lengths, world=worlds, pad=st.booleans(), data=st.data())
def test_interleaved_prefix_of_every_share_is_a_global_prefix(
    length: int, world: int, pad: bool, data: st.DataObject
) -> None:
    shares = partition(length, world, pad=pad)
    m = data.draw(st.integers(0, len(shares[0])))
    taken = {int(p) for s in shares for p in s[:m]}
    assert taken == set(range(min(length, m * world)))


@settings(max_examples=100, deadline=None)
@given(
    length=st.integers(0, 200),
    world=st.integers(1, 16),
    new_world=st.integers(1, 16),
    pad=st.booleans(),
    layout=layouts,
    data=st.data(),
)
def test_consumed_then_repartitioned_loses_and_repeats_nothing(
    length: int, world: int, new_world: int, pad: bool, layout: str, data: st.DataObject
) -> None:
    ranges = [(0, length)] if length else []
    shares = partition(length, world, pad=pad, layout=layout)  # type: ignore[arg-type]
    m = data.draw(st.integers(0, len(shares[0])))
    seen = [int(p) for s in shares for p in s[:m]]
    left = consume(ranges, world, m, pad=pad, layout=layout)  # type: ignore[arg-type]
    rest_positions = [p for a, b in left for p in range(a, b)]
    rest = partition(len(rest_positions), new_world, pad=pad, layout=layout)  # type: ignore[arg-type]
    after = [rest_positions[int(i)] for s in rest for i in s]
    counts = Counter(seen + after)
    if pad:
        assert set(counts) == set(range(length))
        # Repeats come from padding only: at most world - 1 before and new_world - 1 after.
        assert sum(counts.values()) - length <= (world - 1) + (new_world - 1)
    else:
        assert max(counts.values(), default=1) == 1
        assert length - len(counts) <= (world - 1) + (new_world - 1)


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    world=st.integers(1, 8),
    seed=st.integers(0, 2**31),
)
def test_block_layout_reads_whole_shards(sizes: list[int], world: int, seed: int) -> None:
    starts = np.cumsum([0, *sizes])
    shard_of = np.repeat(np.arange(len(sizes)), sizes)
    touched_total = 0
    everything: list[int] = []
    for rank in range(world):
        sampler = RankSampler(
            sum(sizes), seed=seed, pad=False, world=World(rank, world), shard_sizes=sizes
        )
        indices = list(sampler)
        everything += indices
        shards = [int(shard_of[i]) for i in indices]
        runs = [s for k, s in enumerate(shards) if k == 0 or shards[k - 1] != s]
        assert len(runs) == len(set(runs))  # each shard is read in one sequential run
        touched_total += len(set(runs))
    assert len(everything) == len(set(everything))
    # Cutting the shard sequence into `world` runs splits at most world - 1 shards.
    assert touched_total <= len(sizes) + world - 1
    assert int(starts[-1]) - len(everything) < world


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_sampler_epochs_cover_and_differ(world: int) -> None:
    n = 50
    samplers = [RankSampler(n, seed=5, world=World(r, world)) for r in range(world)]
    epochs = []
    for _ in range(3):
        per_rank = [list(s) for s in samplers]
        assert len({len(p) for p in per_rank}) == 1
        assert set().union(*per_rank) == set(range(n))
        epochs.append(per_rank)
    assert epochs[0] != epochs[1] != epochs[2]
    assert [s.epoch for s in samplers] == [3] * world


def test_set_epoch_wins_over_the_counter() -> None:
    sampler = RankSampler(20, seed=1, world=World())
    first = list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == first and list(sampler) == first  # pinned: no auto-advance
    sampler.follow_epoch(7)  # what the loader does: ignored once the user drives
    assert sampler.epoch == 0


@pytest.mark.parametrize(("saved_world", "new_world"), [(2, 1), (1, 2), (3, 2), (2, 2)])
def test_state_dict_mid_iteration_resumes_at_another_world(
    saved_world: int, new_world: int
) -> None:
    n = 31
    old = [RankSampler(n, seed=9, world=World(r, saved_world)) for r in range(saved_world)]
    old_iters = [iter(s) for s in old]
    seen = [next(it) for it in old_iters for _ in range(4)]
    state = old[0].state_dict()
    assert state["consumed"] == 4 and state["world_size"] == saved_world
    new = [RankSampler(n, seed=9, world=World(r, new_world)) for r in range(new_world)]
    for s in new:
        s.load_state_dict(state)
    rest = [list(s) for s in new]
    assert len({len(r) for r in rest}) == 1
    counts = Counter(seen + [i for r in rest for i in r])
    assert set(counts) == set(range(n))
    assert sum(counts.values()) - n < new_world  # only the new world's padding repeats


def test_skip_marks_every_rank_share_consumed() -> None:
    samplers = [RankSampler(12, seed=2, world=World(r, 2)) for r in range(2)]
    full = [list(RankSampler(12, seed=2, world=World(r, 2))) for r in range(2)]
    for s in samplers:
        s.skip(2)
    assert [list(s) for s in samplers] == [f[2:] for f in full]


def test_load_state_dict_rejects_other_settings() -> None:
    state = RankSampler(10, seed=1, world=World()).state_dict()
    with pytest.raises(ConfigError, match="length saved 10, now 11"):
        RankSampler(11, seed=1, world=World()).load_state_dict(state)
    with pytest.raises(ConfigError, match="seed saved 1, now 2"):
        RankSampler(10, seed=2, world=World()).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"RankSampler\.state_dict"):
        RankSampler(10).load_state_dict({"epoch": 1})


def test_rank_positions_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="`rank` must be in"):
        rank_positions(5, 2, 2, pad=True)
    with pytest.raises(ConfigError, match="`world_size`"):
        rank_positions(5, 0, 0, pad=True)
    with pytest.raises(ConfigError, match="`rank` must be in"):
        World(rank=3, world_size=2)


def test_world_from_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert World.current() == World(3, 4, 1, source="environment")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="`RANK=3` but `WORLD_SIZE=2`"):
        World.current()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match=r"`RANK` must be an integer\. Found: 'x'"):
        World.current()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_RANK")
    assert World.current() == World()
