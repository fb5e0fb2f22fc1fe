"""torch's per-batch profiler range: kept under a profiler, left out without one."""

from __future__ import annotations

import pytest
import torch
from _datasets import RangeDataset
from torch.autograd import profiler as torch_profiler

import stoker

BACKENDS = [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2, "backend": "thread"}, id="thread"),
    pytest.param({"num_workers": 2, "backend": "process"}, id="process"),
]


def _ranges(events: list[object]) -> list[str]:
    return [e.name for e in events if "enumerate(DataLoader)" in e.name]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kwargs", BACKENDS)
def test_a_profiler_sees_one_range_per_batch(kwargs: dict[str, object]) -> None:
    loader = stoker.DataLoader(RangeDataset(12), batch_size=4, **kwargs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        batches = [b.tolist() for b in loader]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # One range per next() call: three batches, then the call that ends the epoch.
    assert len(_ranges(prof.events())) == 4, _ranges(prof.events())


@pytest.mark.parametrize("kwargs", BACKENDS)
def test_without_a_profiler_no_range_is_opened(
    kwargs: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real = torch_profiler.record_function

    def counting(name: str, *args: object) -> object:
        opened.append(name)
        return real(name, *args)

    monkeypatch.setattr(torch_profiler, "record_function", counting)
    loader = stoker.DataLoader(RangeDataset(12), batch_size=4, **kwargs)
    it = iter(loader)
    assert [b.tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert it._num_yielded == 3
    assert opened == []
    # torch's own loader, as a check that the spy sees its ranges.
    assert [b.tolist() for b in torch.utils.data.DataLoader(RangeDataset(4), batch_size=4)]
    assert len(opened) == 2
