"""The `shards` bench workload reads the same images and labels as the `jpeg` workload."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stoker.bench import _jpeg as bench_jpeg
from stoker.bench._shards import ShardJpegDataset, ensure_shards


def test_shards_workload_matches_loose_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path))
    out = ensure_shards(6, tmp_path / "shards")
    assert ensure_shards(6, tmp_path / "shards") == out  # second call reuses the pack
    packed = ShardJpegDataset(out)
    loose = bench_jpeg.JpegDataset(bench_jpeg.ensure_images(6))
    assert len(packed) == len(loose) == 6
    for i in range(6):
        torch.manual_seed(i)
        a, la = packed[i]
        torch.manual_seed(i)
        b, lb = loose[i]
        assert la == lb and torch.equal(a, b)
    packed.shards.close()


def test_shards_workload_is_registered() -> None:
    from stoker.bench._workloads import get_workload

    workload = get_workload("shards")
    assert workload.batch_size == get_workload("jpeg").batch_size
