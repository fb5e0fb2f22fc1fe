"""stoker.watch on synthetic iterables (fake clock), real sleeps, and real DataLoaders."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from _monitor_synthetic import FakeClock, consume, producer
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import TensorDataset

import stoker
from stoker.errors import ConfigError
from stoker.monitor import Watch, _probe, watch
from stoker.monitor._detect import STALL_WARMUP_STEPS
from stoker.monitor._meter import batch_size


def _watch(source, clock, **kw) -> Watch:
    return Watch(source, clock=clock, progress=False, **kw)


def test_batches_pass_through_unchanged() -> None:
    items = [torch.arange(6).reshape(2, 3), {"a": [1, 2]}, ("x", 3), None]
    seen = list(watch(iter(items), progress=False))
    assert len(seen) == 4 and all(a is b for a, b in zip(seen, items, strict=True))


def test_slow_producer_is_starved() -> None:
    clock = FakeClock()
    w = _watch(producer(clock, [0.030] * 200), clock, every=50)
    consume(w, clock, 0.010)
    s = w.summary()
    assert s.steps == 200 and s.samples == 800
    assert s.wait_fraction == pytest.approx(0.75)
    assert s.wait_s == pytest.approx(6.0) and s.compute_s == pytest.approx(2.0)
    assert s.samples_per_s == pytest.approx(800 / 8.0)
    assert s.verdict == "starved" and s.stalls == ()
    assert [r.step for r in w.reports] == [50, 100, 150, 200]
    assert all(r.wait_fraction == pytest.approx(0.75) for r in w.reports)
    assert w.reports[0].samples_per_s == pytest.approx(200 / 2.0)
    assert "the iterable is slower than the step" in w.reports[0].line()


def test_slow_consumer_is_healthy() -> None:
    clock = FakeClock()
    w = _watch(producer(clock, [0.001] * 150), clock, every=50)
    consume(w, clock, 0.049)
    s = w.summary()
    assert s.wait_fraction == pytest.approx(0.02)
    assert s.verdict == "healthy" and s.action is None
    assert s.median_wait_s == pytest.approx(0.001, rel=0.07)  # histogram resolution
    assert s.median_compute_s == pytest.approx(0.049, rel=0.07)
    assert w.reports[-1].diagnosis == "data-wait 2%: input pipeline is not the bottleneck"


def test_periodic_stalls_are_found_exactly() -> None:
    stall_steps = {60, 130, 200, 270}
    waits = [0.5 if i in stall_steps else 0.002 for i in range(300)]
    waits[3] = 0.8  # during warm-up: not reported
    clock = FakeClock()
    w = _watch(producer(clock, waits), clock, every=100)
    consume(w, clock, 0.02)
    s = w.summary()
    assert [e.step for e in s.stalls] == sorted(stall_steps)
    assert all(e.median_s == pytest.approx(0.002) for e in s.stalls)
    assert [len(r.stalls) for r in w.reports] == [1, 1, 2]
    assert "2 stalls (max 0.50 s)" in w.reports[2].diagnosis
    assert "1 stall (max 0.50 s)" in w.reports[0].diagnosis


def test_sawtooth_is_reported() -> None:
    waits = [0.040 if i % 4 == 3 else 0.0005 for i in range(200)]
    clock = FakeClock()
    w = _watch(producer(clock, waits), clock, every=100)
    consume(w, clock, 0.010)
    assert w.reports[-1].sawtooth is not None and w.reports[-1].sawtooth.period == 4
    assert "sawtooth: wait spikes every 4 steps" in w.reports[-1].diagnosis


def test_break_records_the_last_step_and_second_pass_continues() -> None:
    clock = FakeClock()
    data = [torch.zeros(2, 1)] * 40

    class Slow:
        def __iter__(self):
            for x in data:
                clock.advance(0.001)
                yield x

    w = _watch(Slow(), clock, every=1000)
    for i, _ in enumerate(w):
        clock.advance(0.004)
        if i == 24:
            break
    assert w.steps == 25 and w.summary().compute_s == pytest.approx(0.100)
    # second pass (an epoch): the first batch is slow, as when workers restart
    clock2_waits = iter([2.0] + [0.001] * 39)

    class Restarting:
        def __iter__(self):
            for x in data:
                clock.advance(next(clock2_waits))
                yield x

    w.source = Restarting()
    consume(w, clock, 0.004)
    assert w.steps == 65
    assert len(w.reports) == 2  # the partial interval of each pass
    stalls = w.summary().stalls
    assert STALL_WARMUP_STEPS <= 25
    assert [(e.step, e.epoch_start) for e in stalls] == [(25, True)]
    assert "persistent_workers=True" in str(w.summary().action)


def test_exception_in_loop_closes_the_pass(tmp_path) -> None:
    clock = FakeClock()
    w = _watch(producer(clock, [0.001] * 10), clock, log=tmp_path / "r.jsonl")
    with pytest.raises(RuntimeError):
        for _ in w:
            clock.advance(0.002)
            raise RuntimeError("boom")
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert '"kind":"summary"' in lines[-1] and w.steps == 1


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (torch.zeros(7, 3), 7),
        (torch.tensor(3.0), 1),
        ((torch.zeros(5, 2), torch.zeros(5)), 5),
        ([torch.zeros(6, 2), torch.zeros(6)], 6),
        ((torch.tensor(2.0), torch.zeros(3)), 1),
        (torch.nn.Parameter(torch.zeros(4, 2)), 4),
        (np.zeros((3, 2)), 3),
        ({"image": torch.zeros(9, 3), "label": torch.zeros(9)}, 9),
        ({"meta": {"ids": [1, 2, 3]}}, 3),
        (["a", "b"], 2),
        ([], 0),
        (object(), None),
    ],
)
def test_batch_size(batch, expected) -> None:
    assert batch_size(batch) == expected


def test_unknown_sizes_fall_back_to_steps_per_second() -> None:
    clock = FakeClock()

    def objects():
        for _ in range(30):
            clock.advance(0.01)
            yield object()

    w = _watch(objects(), clock, every=10)
    consume(w, clock, 0.01)
    assert w.summary().samples is None and w.reports[0].samples_per_s is None
    assert w.reports[0].steps_per_s == pytest.approx(50.0)
    assert "50.0 steps/s" in w.reports[0].line()


def test_custom_size() -> None:
    clock = FakeClock()
    w = _watch(producer(clock, [0.01] * 5), clock, size=lambda b: 10)
    consume(w, clock, 0.01)
    assert w.summary().samples == 50


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"every": 0}, "`every` must be an int >= 1. Found: 0."),
        ({"every": 2.5}, "`every`"),
        ({"progress": "yes"}, "`progress`"),
        ({"log": "/proc/no/such/dir/run.jsonl"}, "`log` must be a writable file path"),
    ],
)
def test_bad_arguments(kw, match) -> None:
    with pytest.raises(ConfigError, match=match):
        watch([1, 2], **kw)


def test_not_iterable() -> None:
    with pytest.raises(ConfigError, match="needs an iterable"):
        watch(42)  # type: ignore[arg-type]


def test_tensorboard_without_package(tmp_path, monkeypatch) -> None:
    from stoker.monitor import _sinks

    monkeypatch.setattr(_sinks, "tensorboard_available", lambda: False)
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        watch([1], tensorboard=tmp_path)


def test_tensorboard_scalars_are_the_health_reports(tmp_path) -> None:
    """Real event files, read back with TensorBoard's own reader, hold every interval's
    scalars; each pass writes its own file and closes its writer."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = watch(
        [torch.zeros(4, 2) for _ in range(30)], every=10, progress=False, tensorboard=tmp_path
    )
    for _ in range(2):  # two passes
        for _ in w:
            time.sleep(0.001)
    files = sorted(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 2
    got: dict[str, list[tuple[int, float]]] = {}
    for f in files:
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            got.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    assert {"stoker/data_wait_fraction", "stoker/samples_per_s", "stoker/stalls"} <= set(got)
    want = sorted((r.step, r.wait_fraction) for r in w.reports)
    have = sorted(got["stoker/data_wait_fraction"])
    assert len(want) == 6 and [s for s, _ in have] == [s for s, _ in want]
    assert [v for _, v in have] == pytest.approx([v for _, v in want], rel=1e-5, abs=1e-7)


@pytest.mark.measures  # asserts a measured wait fraction
def test_real_time_with_sleeps() -> None:
    def slow(n: int):
        for _ in range(n):
            time.sleep(0.006)
            yield torch.zeros(2)

    w = watch(slow(25), every=10, progress=False)
    for _ in w:
        time.sleep(0.002)
    s = w.summary()
    assert s.steps == 25 and s.samples == 50
    # 6 ms wait vs 2 ms compute: 75% in theory; generous bounds for a loaded machine
    assert 0.4 < s.wait_fraction < 0.95
    assert s.wait_s >= 25 * 0.006 and s.compute_s >= 25 * 0.002


def test_torch_dataloader_with_workers() -> None:
    ds = TensorDataset(torch.arange(64.0).reshape(32, 2))
    loader = TorchDataLoader(ds, batch_size=4, num_workers=2)
    w = watch(loader, every=3, progress=False)
    out = [b[0] for b in w]
    assert torch.equal(torch.cat(out), ds.tensors[0])
    assert w.summary().samples == 32
    health = w.reports[0].loader
    assert health is not None and health.num_workers == 2 and health.backend == "process"
    # Torch's workers give no stats: the fraction comes from their CPU time, and it is a number.
    assert health.busy_source == "cpu"
    assert health.busy_fraction is not None and 0.0 <= health.busy_fraction <= 1.0


def test_stoker_dataloader_stats_are_read() -> None:
    ds = TensorDataset(torch.arange(40.0))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=0)
    w = watch(loader, every=5, progress=False)
    assert [float(x) for b in w for x in b[0]] == list(range(40))
    health = w.reports[0].loader
    assert health is not None and health.backend == "inline" and health.num_workers == 0
    assert health.failures == 0 and health.worker_restarts == 0


def test_loader_is_read_at_most_every_sample_interval(monkeypatch) -> None:
    """Health intervals closer together than SAMPLE_MIN_INTERVAL_S reuse the last reading."""
    monkeypatch.setattr(_probe, "SAMPLE_MIN_INTERVAL_S", 1.0)
    clock = FakeClock()
    ds = TensorDataset(torch.arange(40.0))
    loader = stoker.DataLoader(ds, batch_size=1, num_workers=0)
    reads = []
    real_stats = loader.stats
    monkeypatch.setattr(loader, "stats", lambda: reads.append(clock()) or real_stats())
    w = Watch(loader, every=5, progress=False, clock=clock)
    t0 = clock()
    for _ in w:
        clock.advance(0.1)  # an interval every 0.5 s
    assert len(w.reports) == 8 and all(r.loader is not None for r in w.reports)
    assert [t - t0 for t in reads] == pytest.approx([0.5, 1.5, 2.5, 3.5])


@pytest.mark.measures  # a reading thread races the pass's wall time
def test_worker_pss_is_read_in_a_thread_that_ends_with_the_pass(monkeypatch) -> None:
    monkeypatch.setattr(_probe, "SAMPLE_MIN_INTERVAL_S", 0.0)
    monkeypatch.setattr(_probe, "PSS_MIN_INTERVAL_S", 0.0)
    ds = TensorDataset(torch.arange(400.0))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2)
    w = watch(loader, every=2, progress=False)
    for _ in w:
        time.sleep(0.002)
    assert not [t for t in threading.enumerate() if t.name == "stoker-watch-pss"]
    readings = [r.loader.pss_bytes for r in w.reports if r.loader and r.loader.pss_bytes]
    assert readings and all(len(p) == 2 and min(p) > 1 << 20 for p in readings), readings
