"""Hugging Face Accelerate's ``prepare()`` takes a ``stoker.DataLoader`` and trains from it.

Optional: skipped when ``accelerate`` is not installed (``pip install stoker[trainers]``).
Accelerate rebuilds every loader it prepares as its own ``DataLoaderShard`` around torch's
``DataLoader``, from the loader's torch arguments: the prepared loader yields the same batches,
loaded by torch's engine (stoker's extras do not carry over). Runs in a forked child with a
hard limit, as Accelerate sets process-wide state.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import BATCH, SAMPLES, TinyDataset

import stoker

accelerate = pytest.importorskip(
    "accelerate", reason="Hugging Face Accelerate is not installed (extra `trainers`)"
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from _isolate import run_case  # noqa: E402

PREPARE_LIMIT_S = 60.0


def case_prepare_and_train(workers: int) -> dict[str, Any]:
    accelerator = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = stoker.DataLoader(TinyDataset(), batch_size=BATCH, num_workers=workers)
    expected = [x.flatten().tolist() for x, _ in loader]
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    before = [p.detach().clone() for p in model.parameters()]
    got = []
    for x, y in prepared:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        got.append(x.flatten().tolist())
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    return {"expected": expected, "got": got, "trained": moved, "len": len(prepared)}


@pytest.mark.parametrize("workers", [0, 2])
def test_prepare_trains_from_a_stoker_loader(workers: int) -> None:
    r = run_case(case_prepare_and_train, limit_s=PREPARE_LIMIT_S, workers=workers).result
    assert r["len"] == SAMPLES // BATCH
    assert r["got"] == r["expected"]
    assert r["trained"]
