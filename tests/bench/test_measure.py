"""CPU and PSS meters of the process tree."""

from __future__ import annotations

import multiprocessing
import time

import psutil
import pytest

from stoker.bench import _measure
from stoker.bench._measure import Meter, TreeMeter


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds  # this thread only: the meter's thread runs beside
    while time.thread_time() < end:
        pass


@pytest.fixture(autouse=True)
def _fast_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_measure, "PSS_INTERVAL_S", 0.01)


@pytest.mark.measures
def test_main_process_cpu_and_pss_are_measured() -> None:
    with Meter() as meter:
        _burn(0.1)
    usage = meter.usage
    assert usage is not None
    assert usage.main_cpu_s >= 0.08  # psutil reads clock ticks (10 ms)
    assert usage.tree_cpu_s >= usage.main_cpu_s
    assert usage.peak_pss_bytes > 10 * 2**20  # an interpreter with torch loaded


@pytest.mark.measures
def test_children_cpu_counts_in_the_tree_not_the_main_process() -> None:
    ctx = multiprocessing.get_context("fork")
    with Meter(TreeMeter.children_now()) as meter:
        child = ctx.Process(target=_burn, args=(0.3,))
        child.start()
        child.join()
    usage = meter.usage
    assert usage is not None
    assert usage.tree_cpu_s - usage.main_cpu_s >= 0.25
    assert usage.main_cpu_s < 0.25


def test_children_in_the_baseline_are_ignored_for_pss() -> None:
    ctx = multiprocessing.get_context("fork")
    event = ctx.Event()
    child = ctx.Process(target=event.wait, args=(5,))
    child.start()
    try:
        alone = TreeMeter(TreeMeter.children_now())
        alone.start()
        with_child = TreeMeter(set())
        with_child.start()
        time.sleep(0.05)
        assert with_child.stop().peak_pss_bytes > alone.stop().peak_pss_bytes
    finally:
        event.set()
        child.join()


@pytest.mark.measures
def test_the_pss_is_read_where_the_resident_set_grew_not_every_interval() -> None:
    """A PSS reading walks every page table (41 ms for a main process and two workers on
    jpeg): taken every interval, it cost the loaders a fifth of the 2-core VM."""
    base = _measure._pss(psutil.Process())
    meter = TreeMeter(set())
    meter.start()
    time.sleep(0.1)  # about 10 readings of the resident set, steady
    blob = b"\x01" * (256 * 2**20)  # written: resident, not only reserved
    time.sleep(0.1)
    del blob
    time.sleep(0.1)
    usage = meter.stop()
    assert usage.peak_pss_bytes >= base + 200 * 2**20  # the peak, gone before the end
    assert meter.pss_readings <= 4  # the first, the growth (once or twice), the end


@pytest.mark.measures
def test_the_end_reads_the_pss_again_only_where_the_last_reading_is_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end's reading cost a quick run 0.1-0.3 s; a fresh one stands for it."""
    meter = TreeMeter(set())
    meter.start()
    time.sleep(0.1)  # the first interval's reading, then a steady resident set
    assert meter.stop().peak_pss_bytes > 10 * 2**20 and meter.pss_readings == 1
    monkeypatch.setattr(_measure, "PSS_FRESH_S", 0.0)
    meter = TreeMeter(set())
    meter.start()
    time.sleep(0.1)
    meter.stop()
    assert meter.pss_readings == 2
    # A meter stopped before its first interval reads it at the end.
    monkeypatch.setattr(_measure, "PSS_FRESH_S", 10.0)
    meter = TreeMeter(set(), interval_s=10.0)
    meter.start()
    assert meter.stop().peak_pss_bytes > 10 * 2**20 and meter.pss_readings == 1
