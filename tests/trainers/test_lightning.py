"""PyTorch Lightning trains from a ``stoker.DataLoader``, and rebuilds it with a distributed
sampler as it does torch's (``use_distributed_sampler``), keeping stoker's class and settings.

Optional: skipped when ``pytorch_lightning`` is not installed (``pip install stoker[trainers]``).
The ``Trainer.fit`` case runs in a forked child with a hard limit: it starts a (one-process)
gloo process group, which must not outlive it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import BATCH, SAMPLES, TinyDataset
from torch.utils.data import DistributedSampler

import stoker

pl = pytest.importorskip(
    "pytorch_lightning", reason="PyTorch Lightning is not installed (extra `trainers`)"
)
from pytorch_lightning.utilities.data import _update_dataloader  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from _isolate import run_case  # noqa: E402

# Optimiser steps of the fit; the fit's hard limit (Lightning imports and a gloo group: ~10 s).
STEPS = 3
FIT_LIMIT_S = 90.0


class TinyModule(pl.LightningModule):  # type: ignore[misc]
    """One linear layer; records what ``train_dataloader`` became inside the trainer."""

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.workers = workers
        self.seen: list[dict[str, Any]] = []

    def train_dataloader(self) -> stoker.DataLoader:
        return stoker.DataLoader(
            TinyDataset(), batch_size=BATCH, shuffle=True, num_workers=self.workers
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loader = self.trainer.train_dataloader
        self.seen.append(
            {
                "loader": type(loader).__name__,
                "is_stoker": isinstance(loader, stoker.DataLoader),
                "sampler": type(loader.sampler).__name__,
                "batch": len(batch[0]),
            }
        )
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def case_fit(strategy: str, workers: int) -> dict[str, Any]:
    model = TinyModule(workers)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        use_distributed_sampler=True,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return {"seen": model.seen, "steps": trainer.global_step}


@pytest.mark.parametrize(
    ("strategy", "workers"), [("auto", 0), ("ddp", 2)], ids=["single-main", "ddp-workers"]
)
def test_fit_runs_on_a_stoker_loader(strategy: str, workers: int) -> None:
    r = run_case(case_fit, limit_s=FIT_LIMIT_S, strategy=strategy, workers=workers).result
    assert r["steps"] == STEPS
    assert len(r["seen"]) == STEPS
    for step in r["seen"]:
        assert step["is_stoker"], step  # the rebuilt loader is still stoker's
        assert step["batch"] == BATCH
    if strategy == "ddp":  # Lightning put its distributed sampler in
        assert {step["sampler"] for step in r["seen"]} == {"DistributedSampler"}


def test_lightning_rebuild_with_a_distributed_sampler_keeps_stokers_settings() -> None:
    loader = stoker.DataLoader(
        TinyDataset(), batch_size=BATCH, num_workers=2, on_error="skip", max_worker_restarts=1
    )
    sampler = DistributedSampler(TinyDataset(), num_replicas=2, rank=1, shuffle=False)
    clone = _update_dataloader(loader, sampler)
    assert type(clone) is stoker.DataLoader
    assert clone.sampler is sampler
    assert (clone.on_error, clone.max_worker_restarts, clone.num_workers) == ("skip", 1, 2)
    xs = [round(float(v) * SAMPLES) for x, _ in clone for v in x.flatten()]
    assert xs == list(range(1, SAMPLES, 2))  # rank 1 of 2: every other sample
