"""Loading a few batches at a time in the main process (``num_workers="auto"`` chose it).

The caller's random state is saved and restored once per group instead of once per batch
(numpy's legacy state alone costs about 70 us a batch). Nothing else may change: each batch
is seeded from its own index, the caller's streams are untouched, errors and failures come
with the batch they belong to, and a saved epoch resumes exactly.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from _datasets import FailingDataset, RandomAugDataset, SampleError

import stoker
from stoker.loader import _inline


def _loader(dataset: Any, ahead: bool, **kwargs: Any) -> stoker.DataLoader:
    loader = stoker.DataLoader(dataset, num_workers=0, **kwargs)
    loader._inline_ahead = ahead  # what the backend probe sets when it chooses the main process
    return loader


def _draws() -> tuple[float, float, float]:
    return float(torch.rand(())), random.random(), float(np.random.random())


@pytest.mark.parametrize("group", [1, 3, 16])
def test_batches_and_the_callers_streams_are_those_of_one_batch_at_a_time(
    group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_inline, "GROUP_BATCHES", group)
    monkeypatch.setattr(_inline, "GROUP_S", 10.0)  # groups end by count, not time
    runs = []
    for ahead in (False, True):
        torch.manual_seed(7), random.seed(7), np.random.seed(7)
        np.random.standard_normal()  # leaves a cached Gaussian in numpy's legacy state
        loader = _loader(RandomAugDataset(37), ahead, batch_size=4, shuffle=True, generator=_gen())
        batches, between = [], []
        it = iter(loader)
        assert it._group == (group if ahead else 1)
        for batch in it:
            batches.append([t.tolist() for t in batch])
            between.append(_draws())  # the training loop's own randomness
        runs.append((batches, between, np.random.standard_normal()))
    assert runs[0] == runs[1]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(3)


def test_an_error_is_raised_when_its_batch_is_due_and_loading_goes_on_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_inline, "GROUP_S", 10.0)
    loader = _loader(FailingDataset(20, bad=9), True, batch_size=4)
    it = iter(loader)
    assert [next(it).tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(SampleError, match="sample 9 is corrupt"):
        next(it)
    assert [b.tolist() for b in it] == [[12, 13, 14, 15], [16, 17, 18, 19]]


def test_failures_are_recorded_with_the_batch_they_belong_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_inline, "GROUP_S", 10.0)
    loader = _loader(FailingDataset(12, bad=5), True, batch_size=4, on_error="skip")
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    assert not loader.failures  # batch 1, already loaded, is not delivered yet
    assert next(it).tolist() == [4, 6, 7]
    assert [f.index for f in loader.failures] == [5]


def test_a_saved_epoch_resumes_with_the_batches_loaded_ahead_but_not_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_inline, "GROUP_S", 10.0)
    loader = _loader(RandomAugDataset(40), True, batch_size=4, shuffle=True, generator=_gen())
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(3)]  # 16 batches were loaded, 3 delivered
    state = loader.state_dict()
    rest = [b[0].tolist() for b in it]
    resumed = _loader(RandomAugDataset(40), True, batch_size=4, shuffle=True, generator=_gen())
    resumed.load_state_dict(state)
    assert [b[0].tolist() for b in resumed] == rest
    assert sorted(i for b in head + rest for i in b) == list(range(40))
