"""Per-batch seeds depend on (epoch seed, batch index) only, and seed every generator."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from stoker.sampling._seeding import CallerRandomState, WorkerSeeding, batch_seed, seed_all


@given(st.integers(-(2**63), 2**63 - 1), st.integers(0, 10**9))
def test_batch_seed_is_deterministic_and_in_range(epoch_seed, idx):
    s = batch_seed(epoch_seed, idx)
    assert s == batch_seed(epoch_seed, idx)
    assert 0 <= s < 2**63


def test_neighbouring_batches_and_epochs_get_distinct_seeds():
    seeds = {batch_seed(e, i) for e in range(20) for i in range(500)}
    assert len(seeds) == 20 * 500


def test_seed_all_makes_torch_random_and_numpy_repeat():
    def draw():
        return (torch.rand(3).tolist(), random.random(), np.random.rand())

    seed_all(batch_seed(1, 2))
    first = draw()
    seed_all(batch_seed(1, 3))
    other = draw()
    seed_all(batch_seed(1, 2))
    assert draw() == first != other


def _all_states() -> tuple[object, ...]:
    legacy = np.random.get_state()
    numpy_state = (legacy[0], legacy[1].tolist(), legacy[2], legacy[3], legacy[4])
    return numpy_state, torch.get_rng_state().tolist(), random.getstate()


def _load_a_batch(seed: int) -> None:
    """What a dataset may do between save and restore: reseeded, it draws from all three,
    and leaves a Gaussian in numpy's cache."""
    seed_all(seed)
    np.random.standard_normal()
    random.random()
    torch.rand(2)


@pytest.mark.parametrize("between", ["nothing", "cached-gaussian", "draw", "take-cached"])
def test_the_callers_random_states_come_back_exactly(between: str) -> None:
    """The shortcut (numpy's raw state compared and copied back) must restore exactly what
    the full get_state/set_state would, whatever the caller did between batches."""
    guard = CallerRandomState()
    np.random.seed(7), random.seed(7), torch.manual_seed(7)
    if between == "cached-gaussian":
        np.random.standard_normal()  # the caller's own cached Gaussian
    for k in range(5):
        if k == 2 and between == "draw":
            np.random.random()
        if k == 2 and between == "take-cached":
            np.random.standard_normal(), np.random.standard_normal()  # fills, then empties it
        before = _all_states()
        saved = guard.save()
        _load_a_batch(k)
        guard.restore(saved)
        assert _all_states() == before, k


def test_numpys_state_is_read_only_when_the_caller_moved_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    guard = CallerRandomState()
    reads = []
    get_state = np.random.get_state
    monkeypatch.setattr(np.random, "get_state", lambda: reads.append(1) or get_state())
    np.random.seed(3)
    for _ in range(3):
        guard.restore(guard.save())
    assert len(reads) == 1  # the first save; the state did not move since
    np.random.random()
    guard.restore(guard.save())
    assert len(reads) == 2


def _draws() -> tuple[list[float], float, float]:
    return (torch.rand(3).tolist(), random.random(), float(np.random.rand()))


@pytest.fixture
def restore_global_generators():
    saved = CallerRandomState()
    state = saved.save()
    yield
    saved.restore(state)


@pytest.mark.usefixtures("restore_global_generators")
def test_worker_seeding_without_reseed_follows_the_batch_seed() -> None:
    seeding = WorkerSeeding(worker_seed=40)
    torch.rand(2), random.random(), np.random.rand()  # a worker_init_fn that only draws
    seeding.adopt()
    seeding.before_batch(seed=999, epoch=0, batch=3)
    got = _draws()
    seed_all(999)
    assert got == _draws()


@pytest.mark.usefixtures("restore_global_generators")
def test_worker_seeding_follows_seeds_set_in_worker_init_fn_whatever_the_worker() -> None:
    def batch(worker_seed: int, batch_seed_: int) -> tuple[int, tuple[list[float], float, float]]:
        seeding = WorkerSeeding(worker_seed)
        torch.manual_seed(12345)
        random.seed(7)
        np.random.seed(8)
        seeding.adopt()
        seeding.before_batch(batch_seed_, epoch=1, batch=5)
        return torch.initial_seed(), _draws()

    seed, draws = batch(40, 999)
    assert seed == 12345
    assert batch(41, 1000) == (seed, draws)  # another worker, another loader seed
    seeding = WorkerSeeding(40)
    torch.manual_seed(12345)
    seeding.adopt()
    seeding.before_batch(999, epoch=1, batch=6)
    assert torch.initial_seed() == 12345 and _draws()[0] != draws[0]  # another batch
    seed_all(999)
    assert _draws()[1:] != draws[1:]  # not the loader's batch seed
