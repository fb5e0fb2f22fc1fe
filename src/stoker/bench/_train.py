"""The ``train`` family: what a training loop gets from each loader, in training steps/s.

The training step runs in the loader's process: stoker's main-process work (reading slots,
reordering) and, with the thread backend, its workers share the interpreter and the cores with
it. Two step shapes stand for the two kinds of training loop:

* ``gpu``: a launch phase that holds the GIL (many small torch ops, about
  :data:`LAUNCH_S`, as Python launching kernels), then a device wait that releases it (a
  sleep of :data:`DEVICE_WAIT_S` standing in for the GPU);
* ``cpu``: a small model's forward and backward on torch's intra-op threads.

Each step first touches its batch (:func:`~stoker._commands.step.consume`). Per repeat, the
same step is also fed from batches held in memory: its steps/s is the most any loader can
give, and its time per step is the step's own cost, against which each loader's slowdown of
the step is read.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.utils.data as tud

from stoker._commands.step import consume
from stoker.bench._contenders import ContenderSpec
from stoker.bench._plan import Plan, Report, SeededSampler
from stoker.bench._runs import alternate, open_run
from stoker.bench._stats import Ideal
from stoker.bench._train_result import TrainContender, TrainSample, TrainTable
from stoker.bench._workloads import Workload

__all__ = [
    "DEVICE_WAIT_S",
    "LAUNCH_S",
    "SHAPES",
    "CpuStep",
    "GpuLikeStep",
    "bench_train",
    "make_step",
    "train_loop",
    "train_roles",
]

LAUNCH_S = 0.002
DEVICE_WAIT_S = 0.020
# Small ops the launch phase's calibration times (its op count is scaled from them).
CALIBRATION_OPS = 500
# Batches held in memory for the reference run (cycled).
MEMORY_BATCHES = 8
# The cpu step's model: an MLP of this width and depth on a fixed input of this many rows.
MODEL_WIDTH = 512
MODEL_DEPTH = 3
MODEL_ROWS = 128

SHAPES: dict[str, str] = {
    "gpu": f"launch {1000 * LAUNCH_S:.0f} ms holding the GIL, then a "
    f"{1000 * DEVICE_WAIT_S:.0f} ms device wait (sleep)",
    "cpu": f"MLP {MODEL_DEPTH}x{MODEL_WIDTH} forward + backward on {MODEL_ROWS} rows, "
    "torch's intra-op threads",
}

Step = Callable[[Any], None]
Clock = Callable[[], float]


class GpuLikeStep:
    """The ``gpu`` shape: ``ops`` small torch ops holding the GIL, then a ``wait_s`` sleep."""

    def __init__(self, ops: int, wait_s: float = DEVICE_WAIT_S) -> None:
        self.ops, self.wait_s = ops, wait_s
        self.x = torch.zeros(16)

    def launch(self) -> None:
        x = self.x
        for _ in range(self.ops):
            x.add_(1.0)

    def __call__(self, batch: Any) -> None:
        consume(batch)
        self.launch()
        time.sleep(self.wait_s)

    @classmethod
    def calibrated(cls, launch_s: float = LAUNCH_S) -> GpuLikeStep:
        """A step whose launch phase takes about ``launch_s`` alone on this machine."""
        step = cls(CALIBRATION_OPS, 0.0)
        step.launch()  # warm-up: first-call costs
        t0 = time.perf_counter()
        step.launch()
        per_op = max((time.perf_counter() - t0) / CALIBRATION_OPS, 1e-7)
        return cls(max(1, round(launch_s / per_op)))


class CpuStep:
    """The ``cpu`` shape: SGD on a small MLP with a fixed input (torch's intra-op threads)."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(MODEL_DEPTH):
            layers += [torch.nn.Linear(MODEL_WIDTH, MODEL_WIDTH), torch.nn.ReLU()]
        self.model = torch.nn.Sequential(*layers)
        self.x = torch.randn(MODEL_ROWS, MODEL_WIDTH, generator=gen)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)

    def __call__(self, batch: Any) -> None:
        consume(batch)
        self.opt.zero_grad(set_to_none=True)
        self.model(self.x).square().mean().backward()
        self.opt.step()


def make_step(shape: str) -> Step:
    """A fresh step of ``shape`` (``"gpu"`` or ``"cpu"``)."""
    if shape == "gpu":
        return GpuLikeStep.calibrated()
    if shape == "cpu":
        return CpuStep()
    raise ValueError(f"unknown step shape {shape!r}: pick one of {', '.join(SHAPES)}.")


def train_loop(
    batches: Iterator[Any],
    step: Step,
    *,
    seconds: float,
    min_steps: int = 1,
    clock: Clock = time.perf_counter,
) -> TrainSample | None:
    """Run ``step`` on batches from ``batches`` for ``seconds`` and at least ``min_steps``.

    Time in ``next(batches)`` counts as waiting for data, time in ``step`` as the step's own;
    the run ends after the first step that ends ``seconds`` or more after the start, or when
    ``batches`` runs out. Returns ``None`` if not one step ran.
    """
    wait = inside = 0.0
    steps = 0
    start = now = clock()
    for batch in batches:
        got = clock()
        wait += got - now
        step(batch)
        del batch
        now = clock()
        inside += now - got
        steps += 1
        if now - start >= seconds and steps >= min_steps:
            break
    if steps == 0 or now <= start:
        return None
    return TrainSample(seconds=now - start, steps=steps, wait_s=wait, step_s=inside)


def memory_batches(dataset: Any, workload: Workload, count: int = MEMORY_BATCHES) -> list[Any]:
    """``count`` batches of ``dataset`` (torch's loader, no workers), to be fed from memory."""
    sampler = None
    if not isinstance(dataset, tud.IterableDataset):
        sampler = SeededSampler(len(dataset), count * workload.batch_size, seed=0)
    loader = tud.DataLoader(dataset, batch_size=workload.batch_size, sampler=sampler)
    return list(itertools.islice(loader, count))


def train_roles() -> frozenset[str]:
    """The loader-only table's roles that also feed the training step."""
    return frozenset({"stoker-auto", "stoker", "torch-same", "torch-best", "optional"})


def _train_run(
    spec: ContenderSpec,
    dataset: Any,
    workload: Workload,
    plan: Plan,
    step: Step,
    *,
    seed: int,
    ideal: Ideal,
) -> TrainSample:
    with open_run(
        spec,
        dataset,
        workload,
        plan,
        seed=seed,
        run_s=plan.train_run_s,
        ideal=ideal,
        step=step,
        warm_up=plan.warm_up,
        min_batches=plan.train_min_steps,
    ) as run:
        it = iter(run.loader)
        try:
            if plan.fill_s > 0:  # the epoch's start is untimed, as in the loader-only runs
                train_loop(it, step, seconds=plan.fill_s, min_steps=run.fill_batches)
            sample = train_loop(
                it, step, seconds=plan.train_run_s, min_steps=max(2, run.min_batches)
            )
            if sample is not None:
                run.check_outlasted(sample.steps, sample.seconds)
            ended = _ended(run.loader)
        finally:
            del it
    if sample is None:
        raise RuntimeError("the loader yielded no batch for the training step")
    return dataclasses.replace(sample, ended=ended)


def _ended(loader: Any) -> str | None:
    """Where a stoker loader stands (see :attr:`TrainSample.ended`); None for others."""
    from stoker.loader._loader import DataLoader

    if not isinstance(loader, DataLoader):
        return None
    stats = loader.stats()
    return "inline" if stats.backend == "inline" else f"{stats.backend}:{stats.num_workers}"


def _memory_run(batches: list[Any], step: Step, plan: Plan) -> TrainSample | None:
    return train_loop(
        itertools.cycle(batches),
        step,
        seconds=plan.train_run_s,
        min_steps=max(2, plan.train_min_steps),
    )


def bench_train(
    dataset: Any,
    workload: Workload,
    plan: Plan,
    specs: Sequence[ContenderSpec],
    ideal: Ideal,
    report: Report,
) -> tuple[TrainTable, ...]:
    """One :class:`TrainTable` per shape of ``plan.train_shapes``: every spec and the memory
    reference, repeats alternating as in the loader-only runs (the order rotates)."""
    held = memory_batches(dataset, workload)
    tables = []
    names = [s.name for s in specs] + ["fed from memory"]  # the reference joins the rotation
    for shape in plan.train_shapes:
        step = make_step(shape)

        def one(i: int, r: int, step: Step = step) -> TrainSample:
            if i < len(specs):
                return _train_run(specs[i], dataset, workload, plan, step, seed=r + 1, ideal=ideal)
            sample = _memory_run(held, step, plan)
            if sample is None:
                raise RuntimeError("the dataset gave no batch to hold in memory")
            return sample

        runs, errors = alternate(
            names,
            plan.repeats,
            one,
            lambda s: f"{s.steps_per_s:.1f} steps/s",
            report,
            f"{workload.name}: train {shape}: ",
        )
        contenders = tuple(
            TrainContender(s.name, s.library, s.roles, s.config, tuple(runs[i]), errors.get(i))
            for i, s in enumerate(specs)
        )
        memory = tuple(runs[len(specs)])
        tables.append(TrainTable(shape, SHAPES[shape], memory, contenders))
    return tuple(tables)
