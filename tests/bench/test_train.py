"""The train family's accounting (an injected clock and a fake step: no timing asserts)."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from stoker.bench._json import from_json, to_json
from stoker.bench._report import render, verdict
from stoker.bench._train import CpuStep, GpuLikeStep, make_step, train_loop
from stoker.bench._train_result import TrainContender, TrainSample, TrainTable
from stoker.errors import ConfigError

from ._factories import result, workload


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _source(clock: FakeClock, waits: list[float]) -> Iterator[int]:
    """Batches 0, 1, ...; fetching batch i advances the clock by waits[i]."""
    for i, wait in enumerate(waits):
        clock.now += wait
        yield i


def test_wait_and_step_time_are_told_apart() -> None:
    clock = FakeClock()
    seen: list[int] = []

    def step(batch: int) -> None:
        seen.append(batch)
        clock.now += 0.02

    sample = train_loop(_source(clock, [0.5, 0.0, 0.1, 0.0, 0.0]), step, seconds=0.65, clock=clock)
    # Steps end at 0.52, 0.54, 0.66: the third is the first to end 0.65 s after the start.
    assert sample is not None and sample.steps == 3
    assert sample.seconds == pytest.approx(0.66)
    assert sample.wait_s == pytest.approx(0.6) and sample.step_s == pytest.approx(0.06)
    assert seen == [0, 1, 2]
    assert sample.steps_per_s == pytest.approx(3 / 0.66)
    assert sample.wait_share == pytest.approx(0.6 / 0.66)
    assert sample.step_ms == pytest.approx(20.0)


def test_min_steps_outlast_the_time_and_a_short_source_ends_the_run() -> None:
    clock = FakeClock()

    def step(batch: int) -> None:
        clock.now += 1.0

    long = train_loop(_source(clock, [0.0] * 10), step, seconds=0.5, min_steps=4, clock=clock)
    assert long is not None and long.steps == 4 and long.seconds == pytest.approx(4.0)
    short = train_loop(_source(clock, [0.0] * 2), step, seconds=100.0, clock=clock)
    assert short is not None and short.steps == 2
    assert train_loop(iter([]), step, seconds=1.0, clock=clock) is None


def _table(*, memory_ms: float = 20.0) -> TrainTable:
    def runs(rate: float, step_ms: float, wait: float = 0.1) -> tuple[TrainSample, ...]:
        steps = int(rate * 2)
        return (TrainSample(2.0, steps, wait * 2.0, steps * step_ms / 1000),)

    return TrainTable(
        shape="gpu",
        description="launch then wait",
        memory=runs(44.0, memory_ms, 0.0),
        contenders=(
            TrainContender(
                "stoker auto", "stoker", ("stoker-auto",), {"num_workers": "auto"}, runs(42.0, 21.0)
            ),
            TrainContender(
                "stoker nw=2", "stoker", ("stoker",), {"num_workers": 2}, runs(40.0, 22.0)
            ),
            TrainContender(
                "torch nw=2 pf=2",
                "torch",
                ("torch-same",),
                {"num_workers": 2},
                runs(30.0, 25.0, 0.3),
            ),
            TrainContender(
                "torch nw=4 pf=4", "torch", ("torch-best",), {"num_workers": 4}, runs(35.0, 24.0)
            ),
            TrainContender(
                "spdl threads=8", "spdl", ("optional",), {"num_workers": 8}, error="RuntimeError: x"
            ),
        ),
    )


def test_table_reads_best_ratio_and_the_steps_slowdown() -> None:
    t = _table()
    best = t.best("torch")
    assert best is not None and best.name == "torch nw=4 pf=4"
    auto = t.with_role("stoker-auto")
    assert auto is not None
    assert t.ratio_to_best(auto) == pytest.approx(42 / 35)
    assert t.slowdown(auto) == pytest.approx(21 / 20)
    assert t.memory_steps_per_s == pytest.approx(44.0)
    assert t.best("spdl") is None  # it failed: no best, no comparison


def test_train_table_survives_json_leads_the_verdict_and_is_rendered() -> None:
    w = dataclasses.replace(workload(), train=(_table(),))
    doc = json.loads(json.dumps(to_json(result(w))))
    assert from_json(doc) == result(w)
    parts = verdict(w).split("; ")
    assert parts[0] == "train gpu: stoker auto 1.20x faster than torch's best (torch nw=4 pf=4)"
    buf = io.StringIO()
    render(result(w), Console(file=buf, width=200))
    text = buf.getvalue()
    assert text.index("train gpu") < text.index("loader only")
    for expected in ("fed from memory", "steps/s", "data wait", "1.05x", "failed: RuntimeError"):
        assert expected in text


def test_documents_without_train_tables_still_read() -> None:
    doc = to_json(result())
    del doc["workloads"][0]["train"]
    assert from_json(doc).workloads[0].train == ()


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least one step"):
        TrainSample(1.0, 0, 0.0, 0.0)
    with pytest.raises(ConfigError, match="`seconds`"):
        TrainSample(0.0, 1, 0.0, 0.0)


def test_the_steps_do_their_work_on_a_batch() -> None:
    import torch

    batch: Any = (torch.zeros(4, 8), torch.arange(4))
    gpu = GpuLikeStep(ops=10, wait_s=0.0)
    gpu(batch)
    assert float(gpu.x[0]) == 10.0  # every launch op ran
    assert GpuLikeStep.calibrated().ops >= 1
    cpu = CpuStep()
    before = [p.detach().clone() for p in cpu.model.parameters()]
    cpu(batch)
    assert any(not torch.equal(a, b) for a, b in zip(before, cpu.model.parameters(), strict=True))
    assert isinstance(make_step("cpu"), CpuStep)
    with pytest.raises(ValueError, match="unknown step shape 'tpu'"):
        make_step("tpu")


def _small_run(**plan_changes: Any) -> tuple[Any, Any, Any, Any]:
    """(dataset, workload, plan, ideal) for a training run of a few hundredths of a second."""
    import torch
    from torch.utils.data import TensorDataset

    from stoker.bench._plan import Plan
    from stoker.bench._stats import Ideal
    from stoker.bench._workloads import Workload

    data = TensorDataset(torch.arange(512, dtype=torch.float32))
    w = Workload(name="w", description="d", make_dataset=lambda quick: data, batch_size=8)
    plan = Plan(
        repeats=1, run_s=0.05, warmup_s=0.05, grid_run_s=0.05, ideal_s=0.05,
        grid_workers=(0,), grid_prefetch=(2,), grid_note="", stoker_workers=0, cores=2,
        auto_settle_s=0.05, **plan_changes,
    )  # fmt: skip
    ideal = Ideal(cores=2, cpu_s_per_sample=1e-4, wall_s_per_sample=1e-4, samples=10, note="")
    return data, w, plan, ideal


def test_a_training_runs_loader_settles_beside_the_step_it_feeds() -> None:
    # num_workers="auto" warms up (and picks its backend) during the warm-up: with the step
    # running, as in training, not beside an idle loop.
    from stoker.bench._contenders import ContenderSpec
    from stoker.bench._runs import open_run

    data, w, plan, ideal = _small_run()
    stepped: list[int] = []
    spec = ContenderSpec("torch", 0)
    with open_run(spec, data, w, plan, seed=1, run_s=0.05, ideal=ideal, step=stepped.append):
        warmed = len(stepped)
    assert warmed >= 1  # the warm-up batches went through the step


@pytest.mark.parametrize(
    ("spec_args", "ended"),
    [(("stoker", 0), "inline"), (("stoker", 2), "process:2"), (("torch", 2), None)],
)
def test_a_training_run_records_where_a_stoker_loader_ended(
    spec_args: tuple[str, int], ended: str | None
) -> None:
    from stoker.bench._contenders import ContenderSpec
    from stoker.bench._train import _train_run

    data, w, plan, ideal = _small_run(train_run_s=0.05, fill_s=0.0)
    spec = ContenderSpec(*spec_args)
    sample = _train_run(spec, data, w, plan, lambda batch: None, seed=1, ideal=ideal)
    assert sample.steps >= 2 and sample.ended == ended
    # The JSON document holds each run as vars(sample) and reads it back as TrainSample(**run);
    # a document written before `ended` existed reads as None.
    assert TrainSample(**json.loads(json.dumps(vars(sample)))) == sample
    old = {k: v for k, v in vars(sample).items() if k != "ended"}
    assert TrainSample(**old).ended is None


def test_training_runs_and_the_memory_reference_take_the_plans_fewest_steps() -> None:
    # A window of a few slow steps reads noise: the plan's floor holds however short the
    # time bound, and the run's sampler is sized for it (a pass that ran out would raise).
    from stoker.bench import make_plan
    from stoker.bench._contenders import ContenderSpec
    from stoker.bench._train import _memory_run, _train_run

    data, w, plan, ideal = _small_run(train_run_s=0.0, fill_s=0.0, train_min_steps=40)
    for spec in (ContenderSpec("stoker", 0), ContenderSpec("torch", 0)):
        sample = _train_run(spec, data, w, plan, lambda batch: None, seed=1, ideal=ideal)
        assert sample.steps == 40
    memory = _memory_run([0, 1, 2], lambda batch: None, plan)
    assert memory is not None and memory.steps == 40
    assert make_plan(quick=False, cores=2).train_min_steps == 30
    assert make_plan(quick=True, cores=2).train_min_steps == 0  # quick keeps its 0.4 s windows
    with pytest.raises(ConfigError, match=r"`train_min_steps` must be >= 0\. Found: -1"):
        dataclasses.replace(plan, train_min_steps=-1)
