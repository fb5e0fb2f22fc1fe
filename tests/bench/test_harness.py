"""The harness on tiny sizes: samplers, the ideal, a whole workload with real workers."""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import os
import time
import weakref

import psutil
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from stoker.bench import Plan, Workload, _runs, make_plan, run
from stoker.bench._contenders import PEER_ORDER_NOTES, ContenderSpec
from stoker.bench._harness import SeededSampler, bench_workload, measure_ideal
from stoker.bench._measure import TreeMeter
from stoker.bench._stats import Ideal
from stoker.bench._workloads import get_workload
from stoker.errors import ConfigError


class Squares(Dataset[torch.Tensor]):
    def __init__(self, n: int = 512) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> torch.Tensor:
        return torch.full((16,), idx * idx, dtype=torch.int64)


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return (torch.tensor([i]) for i in range(300))


def _tiny_plan(**changes: object) -> Plan:
    plan = Plan(
        repeats=2,
        run_s=0.05,
        warmup_s=0.01,
        grid_run_s=0.02,
        ideal_s=0.02,
        grid_workers=(0, 1),
        grid_prefetch=(2,),
        grid_note="tiny grid",
        stoker_workers=1,
        cores=2,
    )
    return dataclasses.replace(plan, **changes)  # type: ignore[arg-type]


def _workload(**changes: object) -> Workload:
    w = Workload(
        name="squares", description="d", make_dataset=lambda quick: Squares(), batch_size=32
    )
    return dataclasses.replace(w, **changes)  # type: ignore[arg-type]


def test_seeded_sampler_repeats_per_iteration_and_sizes_the_first_pass() -> None:
    a, b = (
        SeededSampler(10, 25, seed=3, first_samples=4),
        SeededSampler(10, 25, seed=3, first_samples=4),
    )
    assert len(a) == 4
    first_a, first_b = list(a), list(b)
    assert first_a == first_b and len(first_a) == 4
    assert len(a) == 25
    second = list(a)
    assert second == list(b) and len(second) == 25
    assert sorted(second[:10]) == list(range(10))  # each pass over the data is a permutation
    assert list(SeededSampler(10, 25, seed=4)) != list(SeededSampler(10, 25, seed=3))


def test_seeded_sampler_rejects_an_empty_dataset() -> None:
    with pytest.raises(ConfigError, match="at least one sample"):
        SeededSampler(0, 5, seed=0)


def test_measure_ideal_counts_whole_batches() -> None:
    ideal = measure_ideal(Squares(), _workload(), cores=2, seconds=0.0)
    assert ideal.samples == 3 * 32  # IDEAL_MIN_BATCHES after one warm-up batch
    assert ideal.cores == 2 and ideal.cpu_s_per_sample > 0
    assert ideal.samples_per_s == pytest.approx(2 / ideal.cpu_s_per_sample)


def test_measure_ideal_works_for_iterable_datasets() -> None:
    ideal = measure_ideal(Stream(), _workload(), cores=1, seconds=0.0)
    assert ideal.samples == 3 * 32


def test_bench_workload_runs_every_contender_alternately() -> None:
    steps: list[str] = []
    result = bench_workload(
        _workload(), _tiny_plan(), quick=True, progress=lambda m, s: steps.append(m)
    )
    assert result.error is None and result.ideal is not None
    assert [(p.num_workers, p.prefetch_factor) for p in result.grid] == [(0, None), (1, 2)]
    names = [c.name for c in result.contenders]
    assert names[0] == "stoker nw=1" and "torch nw=0" in names  # stoker leads the table
    roles = {r for c in result.contenders for r in c.roles}
    assert {"torch-nw0", "torch-recommended", "torch-same", "torch-best", "stoker"} <= roles
    for c in result.contenders:  # stoker's too: a contender that raised has no runs
        assert c.ok and len(c.runs) == 2, (c.name, c.error)
        for r in c.runs:
            assert r.samples >= 32 and r.batches >= 1 and r.peak_pss_bytes > 0
    assert result.torch_best is not None
    assert steps[0].startswith("squares: ideal")
    assert any("run 2/2" in m for m in steps)


@pytest.mark.parametrize("quick", [True, False])
def test_quick_mode_takes_the_workloads_quick_batch_size(quick: bool) -> None:
    plan = _tiny_plan(repeats=1, grid_workers=(0,), peers=(), references=False)
    workload = _workload(batch_size=32, quick_batch_size=8, samples_per_run=48)
    result = bench_workload(workload, plan, quick=quick)
    size = 8 if quick else 32
    assert result.batch_size == size
    for c in result.contenders:
        assert c.ok and c.runs, (c.name, c.error)
        for r in c.runs:  # 48 samples in whole batches of the size, the last one short
            assert (r.samples, r.batches) == (48, -(-48 // size)), c.name


def test_a_workload_rejects_a_bad_quick_batch_size() -> None:
    for bad in (0, 2.0, "8"):
        with pytest.raises(ConfigError, match="quick_batch_size"):
            _workload(quick_batch_size=bad)


def test_fixed_size_runs_and_epochs_mode() -> None:
    fixed = bench_workload(_workload(samples_per_run=96), _tiny_plan(repeats=1), quick=True)
    for c in fixed.contenders:
        assert c.ok, (c.name, c.error)
        for r in c.runs:
            assert r.samples == 96 and r.batches == 3
    epochs = bench_workload(
        _workload(mode="epochs", epochs=2, make_dataset=lambda q: Squares(64)),
        _tiny_plan(repeats=1),
        quick=True,
    )
    assert epochs.grid == ()
    fresh = [c for c in epochs.contenders if c.config["persistent_workers"] is False]
    assert fresh and fresh[0].ok
    for c in epochs.contenders:
        assert c.ok, (c.name, c.error)
        for r in c.runs:
            assert r.samples == 2 * 64 and len(r.epoch_first_batch_s) == 2


class SlowStart(Dataset[torch.Tensor]):
    """Each of the first ``slow`` loads sleeps ``delay``; it counts every load (in-process)."""

    def __init__(self, slow: int, delay: float) -> None:
        self.slow, self.delay, self.loads = slow, delay, 0

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, idx: int) -> torch.Tensor:
        self.loads += 1
        if self.loads <= self.slow:
            time.sleep(self.delay)
        return torch.tensor([idx])


@pytest.mark.measures
def test_a_timed_run_leaves_the_epochs_fill_untimed_and_its_first_batch_latency_in() -> None:
    """The first plan.fill_s seconds of the timed epoch (its pipeline filling) are loaded but
    neither timed nor counted; the first batch's latency is still measured from iter()."""
    from stoker.bench._contenders import ContenderSpec
    from stoker.bench._runs import timed_run

    bs, delay = 8, 0.01
    # Warm-up: one batch (torch, no workers); then the timed epoch's first batch is slow.
    dataset = SlowStart(slow=2 * bs, delay=delay)
    plan = _tiny_plan(fill_s=0.5, run_s=0.05)
    ideal = Ideal(cores=2, cpu_s_per_sample=2e-5, wall_s_per_sample=2e-5, samples=1)
    sample = timed_run(
        ContenderSpec("torch", 0),
        dataset,
        _workload(batch_size=bs),
        plan,
        seed=1,
        run_s=plan.run_s,
        ideal=ideal,
    )
    assert sample.first_batch_s >= bs * delay  # from iter(), through the slow first batch
    # Loaded: the warm-up batch, the fill (at least the slow batch), then the timed run.
    assert dataset.loads >= bs + bs + sample.samples + bs
    assert sample.seconds < plan.fill_s  # the fill's 0.5 s are not in the timed seconds


class Sleepy(Dataset[torch.Tensor]):
    """Each sample sleeps: a thread pool builds its batches side by side, finishing them in
    waves (as SPDL's threads do on CPU-bound work, where the GIL shares out the cores)."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, idx: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.tensor([idx])


WIDE = ContenderSpec("spdl", 8)
# Claims a slow machine: sized by the ideal's time alone, the pass would hold 8 batches.
SLOW_IDEAL = Ideal(cores=2, cpu_s_per_sample=0.05, wall_s_per_sample=0.05, samples=1)


@pytest.mark.measures
def test_a_wide_loaders_training_window_starts_after_its_first_wave_and_ends_before_its_pass() -> (
    None
):
    """The fill drains the batches built side by side before the window (SPDL's 64 threads
    handed their first batch after 20 s, the other 63 with it), and the pass outlasts the
    window: cut short, the window drained batches built before it and read too fast."""
    pytest.importorskip("spdl.pipeline")
    from stoker.bench._train import _train_run

    plan = _tiny_plan(fill_s=0.01, train_run_s=0.02)
    calls: list[object] = []
    sample = _train_run(
        WIDE, Sleepy(), _workload(batch_size=4), plan, calls.append, seed=1, ideal=SLOW_IDEAL
    )
    assert len(calls) - sample.steps >= WIDE.width  # the fill took the whole first wave
    assert sample.steps >= 2 * WIDE.width  # the window: whole waves, not cut by the pass


@pytest.mark.measures
def test_a_wide_loaders_timed_window_is_not_cut_short_by_its_pass() -> None:
    pytest.importorskip("spdl.pipeline")
    from stoker.bench._runs import timed_run

    plan = _tiny_plan(fill_s=0.01, run_s=0.02)
    sample = timed_run(
        WIDE, Sleepy(), _workload(batch_size=4), plan, seed=1, run_s=plan.run_s, ideal=SLOW_IDEAL
    )
    assert sample.batches >= 2 * WIDE.width


def test_a_window_that_its_pass_cut_short_fails_its_run() -> None:
    run = _runs.OpenRun((), min_batches=16, time_bound=1.5, fill_batches=8, sized=True)
    run.check_outlasted(16, 1.5)  # outlasted: nothing to say
    with pytest.raises(_runs.PassRanOut, match=r"ran out after 9 batches in 0\.40 s"):
        run.check_outlasted(9, 0.4)
    with pytest.raises(_runs.PassRanOut, match="needs 16 batches"):
        run.check_outlasted(12, 3.0)
    # A pass the workload fixes (no time bound), or one not sized for the window, may end it.
    dataclasses.replace(run, time_bound=None).check_outlasted(9, 0.4)
    dataclasses.replace(run, sized=False).check_outlasted(9, 0.4)


class Indices(Dataset[int]):
    def __len__(self) -> int:
        return 97

    def __getitem__(self, idx: int) -> int:
        return idx


@pytest.mark.parametrize(
    ("spec", "warms_up"),
    [
        (ContenderSpec("torch", 1), False),  # its workers restart with the timed epoch
        (ContenderSpec("torch", 1, persistent_workers=True), True),
        (ContenderSpec("torch", 0), True),
        (ContenderSpec("stoker", 1), True),
        (ContenderSpec("stoker", 1, persistent_workers=False), False),
    ],
    ids=lambda v: v.name if isinstance(v, ContenderSpec) else str(v),
)
def test_a_warm_up_that_would_not_outlast_its_epoch_is_skipped_on_the_same_sequence(
    spec: ContenderSpec, warms_up: bool
) -> None:
    """Skipping a warm-up changes no sample the timed pass sees: it draws the same second
    pass of the seeded sampler as a contender that warmed up."""
    ideal = Ideal(cores=2, cpu_s_per_sample=0.01, wall_s_per_sample=0.01, samples=1)
    workload = _workload(batch_size=4, make_dataset=lambda quick: Indices())
    plan = _tiny_plan()
    with _runs.open_run(
        spec, Indices(), workload, plan, seed=5, run_s=plan.run_s, ideal=ideal
    ) as opened:
        sampler = opened.loader.sampler  # type: ignore[attr-defined]
        assert spec.warm_up_lasts is warms_up
        assert sampler.passes == (1 if warms_up else 0)
        timed = [int(i) for batch in opened.loader for i in batch]
    reference = SeededSampler(97, sampler.num_samples, seed=5, first_samples=4)
    assert len(list(reference)) == 4  # the warm-up pass
    assert timed == list(reference)


@pytest.mark.parametrize(
    "spec",
    [ContenderSpec("torch", 0), ContenderSpec("torch", 1, 2, True), ContenderSpec("stoker", 1)],
    ids=lambda s: s.name,
)
def test_a_run_leaves_no_loader_behind(spec: ContenderSpec) -> None:
    """Freed by its reference count or by the collection the run makes when it is not."""
    ideal = Ideal(cores=2, cpu_s_per_sample=0.01, wall_s_per_sample=0.01, samples=1)
    plan = _tiny_plan()
    with _runs.open_run(
        spec, Squares(), _workload(), plan, seed=1, run_s=plan.run_s, ideal=ideal
    ) as opened:
        loader = weakref.ref(opened.loader)  # type: ignore[arg-type]
        next(iter(opened.loader))
    assert loader() is None
    assert list(opened.loader) == []  # spent: the name for the run holds no loader


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_ramp_run_collects_garbage_only_for_a_loader_left_in_a_cycle() -> None:
    """A full collection scans every object of the bench (0.12-0.17 s): a ramp's loader that
    its reference count frees needs none."""
    from stoker.bench._ramp import measure_ramp

    workload = get_workload("tiny")
    dataset = workload.make_dataset(True)
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            collections.append(1)

    enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(count)
    try:
        ramp = measure_ramp(dataset, workload, 1, 0.3, 1000.0)
    finally:
        gc.callbacks.remove(count)
        if enabled:
            gc.enable()
    assert ramp.seconds > 0 and collections == []


def test_collect_if_held_collects_only_for_an_object_that_outlived_its_last_name() -> None:
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            collections.append(1)

    enabled = gc.isenabled()
    gc.disable()  # no collection of the interpreter's own in between
    gc.callbacks.append(count)
    try:
        freed = Squares()
        ref = weakref.ref(freed)
        del freed  # its reference count frees it
        _runs.collect_if_held(ref)
        assert collections == []
        held = _Cycle()
        ref = weakref.ref(held)
        del held  # only a collection frees it
        _runs.collect_if_held(ref)
        assert collections == [1] and ref() is None
        _runs.collect_if_held(None)  # no weak reference to judge by: collect
        assert collections == [1, 1]
    finally:
        gc.callbacks.remove(count)
        if enabled:
            gc.enable()


def test_a_dataset_that_cannot_be_built_is_reported_not_raised() -> None:
    def broken(quick: bool) -> Dataset[int]:
        raise OSError("disk on fire")

    result = bench_workload(_workload(make_dataset=broken), _tiny_plan(), quick=True)
    assert result.error == "OSError: disk on fire" and result.contenders == ()


def test_run_with_a_custom_workload_and_progress() -> None:
    class Recorder:
        total = 0
        done = 0

        def start(self, total: int) -> None:
            self.total = total

        def advance(self, message: str, steps: int = 1) -> None:
            self.done += steps

    rec = Recorder()
    result = run([_workload()], plan=_tiny_plan(repeats=1), progress=rec)
    assert rec.total > 0 and rec.done == rec.total
    assert result.workload("squares").torch_best is not None
    assert result.machine["usable_cores"] == 2 and result.repeats == 1
    with pytest.raises(KeyError):
        result.workload("tiny")


def test_plans() -> None:
    quick, full = make_plan(quick=True, cores=2), make_plan(quick=False, cores=2)
    assert quick.repeats == 3 and full.repeats == 5
    assert quick.grid_workers == (0, 2, 4) and full.grid_workers == tuple(range(9))
    assert make_plan(quick=True, cores=16).grid_workers == (0, 16, 32)
    assert not quick.warm_up and full.warm_up  # quick runs: the loader's first epoch
    # prefetch 4 only at stoker's count in quick mode, everywhere in full mode
    points = {(s.num_workers, s.prefetch_factor) for s in quick.grid() if s.library == "torch"}
    assert points == {(0, None), (2, 2), (2, 4), (4, 2)}, points
    assert len([s for s in full.grid() if s.library == "torch"]) == 1 + 8 * 2
    assert "quick mode" in quick.grid_note
    assert make_plan(quick=False, cores=64).grid_workers[-1] == 256
    assert len(make_plan(quick=False, cores=64).grid_workers) < 30
    with pytest.raises(ConfigError, match="`repeats`"):
        run(["tiny"], repeats=0)


def test_ideal_note_reaches_the_result() -> None:
    result = bench_workload(_workload(ideal_note="custom note"), _tiny_plan(repeats=1), quick=True)
    assert isinstance(result.ideal, Ideal) and result.ideal.note == "custom note"


@pytest.fixture(scope="module")
def _resource_tracker() -> None:
    """Spawn starts multiprocessing's resource tracker once per interpreter: start it first."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


@pytest.mark.slow
@pytest.mark.usefixtures("_resource_tracker")
def test_spawned_workers_get_a_picklable_dataset() -> None:
    plan = _tiny_plan(repeats=1, grid_workers=(0, 1), multiprocessing_context="spawn")
    result = bench_workload(_workload(), plan, quick=True)
    torch_runs = [c for c in result.contenders if c.library == "torch"]
    assert torch_runs and all(c.ok for c in torch_runs), [c.error for c in torch_runs]


class Waits(Dataset[torch.Tensor]):
    """Each sample waits 2 ms (I/O-like): auto grows its workers past the start."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, idx: int) -> torch.Tensor:
        import time

        time.sleep(0.002)
        return torch.full((4,), idx)


@pytest.mark.measures
def test_auto_and_watched_contenders_and_ramps_run_for_real() -> None:
    """num_workers="auto" warms up by time and is ramped from 1 and 16 workers; the watched
    contender reports the watch's self-timed cost."""
    steps: list[str] = []
    plan = _tiny_plan(
        repeats=1,
        run_s=0.3,
        stoker_auto=True,
        stoker_watched=True,
        auto_settle_s=0.3,
        ramp_s=0.6,
    )
    wl = _workload(make_dataset=lambda quick: Waits(), batch_size=8)
    result = bench_workload(wl, plan, quick=True, progress=lambda m, s: steps.append(m))
    auto = next(c for c in result.contenders if "stoker-auto" in c.roles)
    assert auto.ok, auto.error
    watched = next(c for c in result.contenders if "stoker-watched" in c.roles)
    assert watched.ok and watched.monitor_overhead is not None
    assert 0 < watched.monitor_overhead < 0.5
    assert [r.start_workers for r in result.ramps] == [1, 16]
    for ramp in result.ramps:
        assert ramp.error is None, ramp.error
        # The probe wants threads; processes load until the loop is seen to leave the GIL
        # free (a 0.6 s ramp may end before the handover).
        assert ramp.decisions[0].startswith("backend=thread"), ramp.decisions
        assert ramp.decisions[1].startswith("processes first") and ramp.backend in (
            "process",
            "thread",
        )
        assert ramp.seconds >= 0.6 and ramp.epoch_s == pytest.approx(
            100_000 / ramp.reference_samples_per_s
        )
    assert sum("auto ramp from" in m for m in steps) == 2


def test_reach_time_is_the_first_full_window_at_the_goal() -> None:
    from stoker.bench._ramp import reach_time

    # 10 samples every 0.1 s for 1 s, then 20 every 0.1 s: the 0.55 s window reaches 95% of
    # 200/s once it holds (nearly) only fast arrivals, from 1.5 s back to 0.95 s; 100/s from
    # the start (a window that reaches back before the start begins at 0).
    times = [round(0.1 * i, 1) for i in range(1, 21)]
    counts, total = [], 0
    for t in times:
        total += 10 if t <= 1.0 else 20
        counts.append(total)
    assert reach_time(times, counts, 200.0, 0.55) == pytest.approx(0.95)
    assert reach_time(times, counts, 100.0, 0.55) == pytest.approx(0.05)
    # A loader at full speed from the first batch is there from the start.
    steady = [round(0.1 * i, 1) for i in range(1, 11)]
    assert reach_time(steady, [10 * i for i in range(1, 11)], 100.0, 0.5) == 0.0
    assert reach_time(times, counts, 1000.0, 0.55) is None
    assert reach_time([], [], 1.0, 0.5) is None


def test_train_family_and_peer_grids_run_every_planned_configuration() -> None:
    """Each installed peer's grid runs beside torch's, each peer joins at its grid's best, and
    the train family feeds the step from memory and from the recommended, same-workers and
    best contenders (every one of them runs: no contender is left failed)."""
    from stoker.bench._contenders import installed_peers

    peers, _ = installed_peers()
    plan = _tiny_plan(
        repeats=1,
        stoker_auto=True,
        auto_settle_s=0.05,
        peers=tuple(peers),
        peer_threads=(1, 2),
        train_shapes=("gpu", "cpu"),
        train_run_s=0.05,
    )
    result = bench_workload(_workload(), plan, quick=True)
    assert [(p.library, p.num_workers) for p in result.grid if p.library == "spdl"] == (
        [("spdl", 1), ("spdl", 2)] if "spdl" in peers else []
    )
    for library in peers:
        best = max(
            (p for p in result.grid if p.library == library and p.samples_per_s),
            key=lambda p: p.samples_per_s or 0.0,
        )
        joined = result.best(library)
        assert joined is not None and joined.config["num_workers"] == best.num_workers
    for c in result.contenders:
        assert c.ok, (c.name, c.error)
    assert [t.shape for t in result.train] == ["gpu", "cpu"]
    fed = {"stoker-auto", "stoker", "torch-same", "torch-best", "optional"}
    want = [c.name for c in result.contenders if fed & set(c.roles)]
    for table in result.train:
        assert [c.name for c in table.contenders] == want
        assert len(table.memory) == 1 and table.memory_step_ms is not None
        for c in table.contenders:
            assert c.ok and len(c.runs) == 1, (c.name, c.error)
            assert c.runs[0].steps >= 2
    # A peer that delivers out of the sampler's order says so under its table, once.
    order_notes = [n for n in result.notes if "sampler's order" in n]
    assert order_notes == ([PEER_ORDER_NOTES["spdl"]] if "spdl" in peers else [])


def test_quick_train_family_is_fed_by_the_torch_row_the_loader_table_stars() -> None:
    """Quick mode fed the step from the short grid's winner while the loader table starred
    another torch row as torch's best: the two verdicts named different configurations."""
    plan = _tiny_plan(
        repeats=2,
        stoker_auto=True,
        auto_settle_s=0.05,
        train_shapes=("gpu",),
        train_run_s=0.05,
        train_roles=frozenset({"stoker-auto", "torch-best"}),
    )
    result = bench_workload(_workload(), plan, quick=True)
    starred = result.torch_best
    assert starred is not None
    (table,) = result.train
    torch_rows = [c.name for c in table.contenders if c.name.startswith("torch")]
    assert torch_rows == [starred.name]
    assert [c.name for c in table.contenders if c.name.startswith("stoker")] == ["stoker auto"]


class Stalls(Dataset[torch.Tensor]):
    """Sample 0 loads; every other one blocks for a minute (a worker that will never answer)."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, idx: int) -> torch.Tensor:
        if idx:
            time.sleep(60)
        return torch.zeros(2)


def test_children_that_exited_are_not_waited_for() -> None:
    """A worker that exited after its library stopped joining it (torchdata's mapper joins for
    0.5 s) is a zombie until reaped: no run waits for it, and multiprocessing's own are reaped."""
    before = TreeMeter.children_now()
    late = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0.1,))
    late.start()  # never joined, as a library's stop that gave up
    pid = os.fork()
    if pid == 0:  # a bare child no one reaps
        os._exit(0)
    try:
        time.sleep(0.5)
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        t0 = time.monotonic()
        _runs.wait_children_exit(before)
        assert time.monotonic() - t0 < _runs.CHILD_EXIT_S / 2
        assert TreeMeter.children_now() - before == {pid}  # multiprocessing's was reaped
    finally:
        os.waitpid(pid, 0)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_run_that_hangs_is_abandoned_in_bounded_time_leaving_no_process(
    workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runs, "RUN_LIMIT_S", 1.0)
    monkeypatch.setattr(_runs, "CLOSE_LIMIT_S", 1.0)
    monkeypatch.setattr(_runs, "CHILD_EXIT_S", 0.5)
    workload = _workload(make_dataset=lambda quick: Stalls(), batch_size=1)
    spec = ContenderSpec("torch", workers, 2 if workers else None, bool(workers))
    ideal = Ideal(cores=2, cpu_s_per_sample=0.001, wall_s_per_sample=0.001, samples=10, note="")
    before = TreeMeter.children_now()
    t0 = time.monotonic()
    with pytest.raises(_runs.RunHung, match="did not end within 1 s"):
        _runs.timed_run(spec, Stalls(), workload, _tiny_plan(), seed=1, run_s=0.2, ideal=ideal)
    assert time.monotonic() - t0 < 15
    assert TreeMeter.children_now() - before == set()
