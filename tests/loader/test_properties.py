"""Property-based tests (Hypothesis): dispatch and reorder deliver what torch delivers.

For random dataset sizes, batch sizes, worker counts, ``drop_last``, shuffling and
``in_order``, the batches a loader with workers yields equal torch's single-process
DataLoader's (as a multiset when ``in_order=False``); iterable datasets interleave exactly as
torch's workers do. Examples are few (each starts worker processes); raise
``STOKER_HYPOTHESIS_EXAMPLES`` locally to search harder.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.utils.data as tud
from _datasets import RangeDataset, ShardedIterable
from _support import LOADERS, to_lists, torch_sharded_iterable_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("STOKER_HYPOTHESIS_EXAMPLES", "12"))
HANG_GUARD_S = 240

CI_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

pytestmark = [
    pytest.mark.timeout(HANG_GUARD_S),
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


@pytest.mark.parametrize("kind", LOADERS)
@CI_SETTINGS
@given(
    n=st.integers(0, 60),
    batch_size=st.integers(1, 9),
    workers=st.integers(1, 3),
    drop_last=st.booleans(),
    shuffle_seed=st.none() | st.integers(0, 2**31 - 1),
    in_order=st.booleans(),
)
def test_map_style_delivers_what_torch_delivers(
    kind: str,
    n: int,
    batch_size: int,
    workers: int,
    drop_last: bool,
    shuffle_seed: int | None,
    in_order: bool,
) -> None:
    def build(cls: type[tud.DataLoader[int]], num_workers: int, **extra: object) -> list[list[int]]:
        generator = None if shuffle_seed is None else torch.Generator().manual_seed(shuffle_seed)
        loader = cls(
            RangeDataset(n),
            batch_size=batch_size,
            drop_last=drop_last,
            shuffle=shuffle_seed is not None,
            generator=generator,
            num_workers=num_workers,
            **extra,
        )
        return to_lists(loader)

    if n == 0 and shuffle_seed is not None:  # RandomSampler refuses an empty dataset
        with pytest.raises(ValueError, match="num_samples") as theirs:
            build(tud.DataLoader, 0)
        with pytest.raises(ValueError) as ours:
            build(LOADERS[kind], workers, multiprocessing_context="fork")
        assert str(ours.value) == str(theirs.value)
        return
    expected = build(tud.DataLoader, 0)
    got = build(LOADERS[kind], workers, multiprocessing_context="fork", in_order=in_order)
    if in_order:
        assert got == expected
    else:
        assert sorted(got) == sorted(expected)
    flat = [i for b in got for i in b]
    assert len(flat) == len(set(flat)), "an index was delivered twice"
    assert len(got) == (n // batch_size if drop_last else -(-n // batch_size))


@pytest.mark.parametrize("kind", LOADERS)
@CI_SETTINGS
@given(
    n=st.integers(0, 40),
    batch_size=st.none() | st.integers(1, 6),
    workers=st.integers(1, 3),
    drop_last=st.booleans(),
)
def test_iterable_interleaves_like_torch(
    kind: str, n: int, batch_size: int | None, workers: int, drop_last: bool
) -> None:
    if batch_size is None:
        drop_last = False
    loader = LOADERS[kind](
        ShardedIterable(n),
        batch_size=batch_size,
        drop_last=drop_last,
        num_workers=workers,
        multiprocessing_context="fork",
    )
    got = to_lists(loader)
    assert got == torch_sharded_iterable_batches(n, workers, batch_size, drop_last)


@pytest.mark.parametrize("kind", LOADERS)
@CI_SETTINGS
@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 6),
    workers=st.integers(1, 3),
    stops=st.lists(st.none() | st.integers(0, 8), min_size=1, max_size=4),
    in_order=st.booleans(),
)
def test_abandoned_epochs_never_leak_into_the_next(
    kind: str, n: int, batch_size: int, workers: int, stops: list[int | None], in_order: bool
) -> None:
    """Persistent workers, epochs broken off at random points: every epoch starts clean."""
    loader = LOADERS[kind](
        RangeDataset(n),
        batch_size=batch_size,
        num_workers=workers,
        multiprocessing_context="fork",
        persistent_workers=True,
        in_order=in_order,
    )
    expected = [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
    for stop in [*stops, None]:  # the last epoch always runs to the end
        got = []
        for batch in loader:
            if stop is not None and len(got) == stop:
                break
            got.append(batch.tolist())
        if stop is None or stop >= len(expected):
            assert (got if in_order else sorted(got)) == expected
        elif in_order:
            assert got == expected[:stop]
        else:
            assert len(got) == stop and all(b in expected for b in got)
            assert len({tuple(b) for b in got}) == stop
