"""Figures derived from raw runs: medians per contender, ratios, fraction of the ideal."""

from __future__ import annotations

import pytest

from stoker.bench._result import RunSample
from stoker.errors import ConfigError

from ._factories import contender, workload


def test_contender_figures_are_medians_over_runs() -> None:
    c = contender(
        "x", "torch", ("torch-nw0",), 100.0, 300.0, 200.0, main_cpu_s=0.2, tree_cpu_s=1.28
    )
    assert c.samples_per_s == pytest.approx(200.0)
    assert c.spread == pytest.approx(0.5)  # (300 - 100) / 2 / 200
    assert c.main_cpu_ms_per_batch == pytest.approx(20.0)  # 0.2 s over 10 batches
    assert c.cpu_s_per_1k_samples == pytest.approx(2.0)  # 1.28 s over 640 samples
    assert c.ok


def test_failed_contender_has_no_figures() -> None:
    c = contender("s", "stoker", ("stoker",), error="RuntimeError: no")
    assert not c.ok
    assert c.samples_per_s is None and c.spread is None and c.epoch_first_batch_s == ()


def test_torch_best_is_the_fastest_torch_contender_in_the_repeats() -> None:
    w = workload()
    assert w.torch_best is not None and w.torch_best.name == "torch nw=1 pf=4"
    assert w.torch_same is not None and w.torch_same.name == "torch nw=2 pf=2"
    assert w.stoker is not None and w.stoker.name == "stoker nw=2"


def test_ratios_and_fraction_of_ideal() -> None:
    w = workload()
    st = w.stoker
    assert st is not None
    assert w.ratio_to_best(st) == pytest.approx(300.0 / 150.0)
    assert w.ratio_to_same(st) == pytest.approx(300.0 / 125.0)
    # ideal = 2 cores / 4 ms = 500 samples/s
    assert w.fraction_of_ideal(st) == pytest.approx(300.0 / 500.0)


def test_stoker_faster_than_every_torch_config_is_not_torch_best() -> None:
    w = workload(stoker_rates=(10_000.0,))
    assert w.torch_best is not None and w.torch_best.library == "torch"


def test_epoch_first_batch_medians_per_epoch() -> None:
    c = contender("e", "torch", ("torch-same",), 1.0, 1.0, 1.0, epochs=(0.5, 0.1, 0.1))
    assert c.epoch_first_batch_s == pytest.approx((0.5, 0.1, 0.1))


def test_run_sample_rejects_empty_runs() -> None:
    with pytest.raises(ConfigError, match="at least one batch"):
        RunSample(
            seconds=1.0,
            samples=0,
            batches=0,
            first_batch_s=0.0,
            main_cpu_s=0.0,
            tree_cpu_s=0.0,
            peak_pss_bytes=0,
        )
    with pytest.raises(ConfigError, match="`seconds`"):
        RunSample(
            seconds=0.0,
            samples=1,
            batches=1,
            first_batch_s=0.0,
            main_cpu_s=0.0,
            tree_cpu_s=0.0,
            peak_pss_bytes=0,
        )
