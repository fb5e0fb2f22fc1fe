"""The workload registry, the cache directory, the consumer and the built-in datasets."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from stoker._commands.step import consume
from stoker.bench import _jpeg, _synthetic
from stoker.bench._workloads import (
    CACHE_ENV,
    Workload,
    builtin_workloads,
    cache_dir,
    get_workload,
    register,
)
from stoker.errors import ConfigError

BUILTIN = {"tiny", "large", "jpeg", "heavytail", "io", "memory", "epochs"}


def test_registry_holds_the_issue_workloads() -> None:
    known = builtin_workloads()
    assert BUILTIN <= set(known)
    # heavytail is left out of --quick: a 1% tail needs longer runs than quick mode gives.
    assert {n for n, w in known.items() if w.in_quick} == {"tiny", "large", "jpeg"}
    assert known["tiny"].batch_size == 256 and known["large"].batch_size == 64
    assert known["epochs"].mode == "epochs" and known["epochs"].epochs == 3


def test_unknown_workload_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown workload .nope.*tiny"):
        get_workload("nope")


def test_register_adds_a_workload_in_one_line() -> None:
    w = register(
        Workload(name="unit-test", description="d", make_dataset=lambda q: [1], batch_size=1)
    )
    try:
        assert get_workload("unit-test") is w
    finally:
        from stoker.bench import _workloads

        _workloads._REGISTRY.pop("unit-test")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": ""}, "`name`"),
        ({"name": "two words"}, "`name`"),
        ({"batch_size": 0}, "`batch_size`"),
        ({"mode": "burst"}, "`mode`"),
        ({"epochs": 0}, "`epochs`"),
        ({"samples_per_run": 0}, "`samples_per_run`"),
    ],
)
def test_workload_validation(kwargs: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {
        "name": "w",
        "description": "d",
        "make_dataset": lambda q: [],
        "batch_size": 4,
    }
    with pytest.raises(ConfigError, match=match):
        Workload(**{**fields, **kwargs})  # type: ignore[arg-type]


def test_cache_dir_honours_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()


def test_consume_counts_samples_of_nested_batches() -> None:
    assert consume((torch.zeros(8, 3), {"y": torch.arange(8)})) == 8
    assert consume([torch.zeros(5, 4096, dtype=torch.uint8)]) == 5
    assert consume({"text": ["a", "b"]}) == 1  # no tensor leaf: counts as one sample
    assert consume(torch.tensor(3.0)) == 1


@pytest.mark.parametrize(
    "dataset",
    [
        _synthetic.TinyDataset(n=10),
        _synthetic.LargeDataset(n=10),
        _synthetic.HeavyTailDataset(10),
        _synthetic.IODataset(10),
        _synthetic.PathsDataset(10),
        _synthetic.EpochsDataset(10),
    ],
    ids=lambda d: type(d).__name__,
)
def test_synthetic_datasets_are_picklable_and_deterministic(dataset: object) -> None:
    again = pickle.loads(pickle.dumps(dataset))
    a, b = dataset[3], again[3]  # type: ignore[index]
    flat_a = a if isinstance(a, tuple) else (a,)
    flat_b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(flat_a, flat_b, strict=True):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def test_synthetic_sample_shapes() -> None:
    tiny = _synthetic.TinyDataset(n=4)[0]
    assert tiny.shape == (64,) and tiny.dtype == torch.int64
    large = _synthetic.LargeDataset(n=4)[1]
    assert large.shape == (3, 224, 224) and large.dtype == torch.float32
    x, y = _synthetic.HeavyTailDataset(4)[2]
    assert x.shape == (64,) and x.dtype == torch.float32 and y == 2


def test_heavy_tail_slows_about_one_sample_in_a_hundred() -> None:
    slow = sum(_synthetic._is_slow(i) for i in range(100_000))
    assert 800 <= slow <= 1200


def test_jpeg_images_are_generated_once_and_decode(tmp_path: Path) -> None:
    paths = _jpeg.ensure_images(3, tmp_path)
    assert len(paths) == 3
    mtimes = [os.path.getmtime(p) for p in paths]
    with Image.open(paths[0]) as img:
        assert img.format == "JPEG" and img.size == (_jpeg.WIDTH, _jpeg.HEIGHT)
    size = os.path.getsize(paths[0])
    assert 20_000 < size < 200_000  # photo-like compression, not a flat colour
    assert _jpeg.ensure_images(3, tmp_path) == paths
    assert [os.path.getmtime(p) for p in paths] == mtimes
    x, label = _jpeg.JpegDataset(paths)[1]
    assert x.shape == (3, 224, 224) and x.dtype == torch.float32 and label == 1
    assert x.is_contiguous() and abs(float(x.mean())) < 3.0


def test_jpeg_dataset_rejects_no_files() -> None:
    with pytest.raises(ConfigError, match="`paths`"):
        _jpeg.JpegDataset([])


@given(st.integers(1, 2000), st.integers(1, 2000), st.integers(0, 2**31))
def test_random_resized_crop_box_stays_inside_the_image(w: int, h: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    left, top, right, bottom = _jpeg.random_resized_crop_box(w, h, gen)
    assert 0 <= left < right <= w and 0 <= top < bottom <= h


def test_random_resized_crop_box_is_reproducible() -> None:
    boxes = [
        _jpeg.random_resized_crop_box(500, 375, torch.Generator().manual_seed(7)) for _ in range(2)
    ]
    assert boxes[0] == boxes[1]
    assert np.prod(np.subtract(boxes[0][2:], boxes[0][:2])) >= 0.08 * 500 * 375 * 0.99
