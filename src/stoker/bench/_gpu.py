"""``stoker bench --device cuda``: the host-to-device half of the pipeline, on a GPU.

Measured in one run, on the same bytes (uint8 256 x 3 x 224 x 224 batches):

* the plain pinned copy rate: a page-locked host batch copied with ``non_blocking=True``
  (``cudaMemcpyAsync``) again and again, timed with CUDA events: the machine's H2D limit;
* stoker's feed rate: ``stoker.DataLoader(..., device="cuda")`` with a consumer that does
  nothing, in GB/s of batches delivered on the device (copies from page-locked slots on a side
  stream), and its ratio to the plain rate;
* the GPU idle fraction of a small conv-net training loop fed by stoker, by torch's
  DataLoader in the seed articles' configuration (0.7 x cores workers, ``prefetch_factor=4``,
  persistent, ``pin_memory=True``, ``.to(device, non_blocking=True)``), and by a batch that is
  already on the device (the loop's own pace): idle = 1 - (device-fed time / fed time).

Needs CUDA: without it the command stops with a clear error.
"""

# stoker is imported when the GPU bench runs (start-up of `stoker bench` without `--device`).

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from stoker._introspect.platform import usable_cores
from stoker.errors import ConfigError

__all__ = ["GpuBenchResult", "run_gpu_bench"]

BATCH = 256
IMAGE = (3, 224, 224)
# Seconds each measurement runs (after a warm-up of WARMUP_BATCHES).
RUN_S = 5.0
WARMUP_BATCHES = 5


class Uint8Images(Dataset[tuple[torch.Tensor, int]]):
    """uint8 images made from one random block (cheap to produce: the copy is what's measured)."""

    def __init__(self, n: int = 100_000) -> None:
        self.n = n
        self.block = torch.randint(0, 256, (64, *IMAGE), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.block[i % 64], i % 1000


def _net(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 5, stride=2),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 1000),
    ).to(device)
    return net, torch.optim.SGD(net.parameters(), lr=0.01)


def _step(net: Any, opt: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.cross_entropy(net(x.float().div_(255)), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


@dataclass(frozen=True)
class GpuBenchResult:
    """Figures of ``stoker bench --device cuda`` (rates in GB/s, times in seconds per batch)."""

    device_name: str
    plain_copy_gbps: float
    stoker_feed_gbps: float
    step_on_device_s: float
    step_stoker_s: float
    step_torch_s: float

    @property
    def copy_ratio(self) -> float:
        return self.stoker_feed_gbps / self.plain_copy_gbps

    @property
    def idle_stoker(self) -> float:
        return max(0.0, 1 - self.step_on_device_s / self.step_stoker_s)

    @property
    def idle_torch(self) -> float:
        return max(0.0, 1 - self.step_on_device_s / self.step_torch_s)


def _plain_copy_gbps(device: torch.device, seconds: float) -> float:
    src = torch.empty((BATCH, *IMAGE), dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device=device)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(WARMUP_BATCHES):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    copies = 0
    start.record()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            dst.copy_(src, non_blocking=True)
        copies += 10
        stop.record()
        stop.synchronize()
    return copies * src.numel() / (start.elapsed_time(stop) / 1000) / 1e9


def _loop(loader: Any, device: torch.device, seconds: float, train: bool, move: bool) -> float:
    """Seconds per batch of a loop over ``loader`` (training or not), epoch after epoch: a
    fast GPU machine runs through an epoch in well under a second."""
    net, opt = _net(device)
    it = iter(loader)

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)

    for _ in range(WARMUP_BATCHES):
        x, y = draw()
    torch.cuda.synchronize(device)
    batches = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x, y = draw()
        if move:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if train:
            _step(net, opt, x, y)
        batches += 1
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    del it
    return elapsed / batches


def run_gpu_bench(device: str = "cuda", seconds: float = RUN_S) -> GpuBenchResult:
    """Measure the H2D path on ``device`` (see the module docstring).

    Raises:
        ConfigError: when CUDA is not available.
    """
    if not torch.cuda.is_available():
        raise ConfigError(
            "`--device cuda` needs a CUDA GPU and a CUDA build of torch; this machine has "
            f"none (torch {torch.__version__}). Run `stoker bench` without `--device`."
        )
    import stoker

    dev = torch.device(device)
    ds = Uint8Images()
    workers = max(1, usable_cores() // 2)
    plain = _plain_copy_gbps(dev, seconds)
    feed: Any = stoker.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, device=dev
    )
    feed_s = _loop(feed, dev, seconds, train=False, move=False)
    del feed
    x = torch.randint(0, 256, (BATCH, *IMAGE), dtype=torch.uint8, device=dev)
    y = torch.randint(0, 1000, (BATCH,), device=dev)
    on_device = _loop(iter(lambda: (x, y), None), dev, seconds, train=True, move=False)
    loader: Any = stoker.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, device=dev
    )
    fed_stoker = _loop(loader, dev, seconds, train=True, move=False)
    del loader
    recommended = max(1, round(0.7 * usable_cores()))
    torch_loader = torch.utils.data.DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=recommended,
        prefetch_factor=4,
        persistent_workers=True,
        pin_memory=True,
    )
    fed_torch = _loop(torch_loader, dev, seconds, train=True, move=True)
    del torch_loader
    batch_bytes = BATCH * IMAGE[0] * IMAGE[1] * IMAGE[2]
    return GpuBenchResult(
        device_name=torch.cuda.get_device_name(dev),
        plain_copy_gbps=plain,
        stoker_feed_gbps=batch_bytes / feed_s / 1e9,
        step_on_device_s=on_device,
        step_stoker_s=fed_stoker,
        step_torch_s=fed_torch,
    )


def render(result: GpuBenchResult) -> str:
    return "\n".join(
        [
            f"GPU: {result.device_name}",
            f"  plain pinned copy (cudaMemcpyAsync): {result.plain_copy_gbps:.1f} GB/s",
            f"  stoker device='cuda' feed:          {result.stoker_feed_gbps:.1f} GB/s "
            f"({result.copy_ratio:.2f} of the plain copy)",
            f"  training step, batch on device:     {result.step_on_device_s * 1e3:.1f} ms",
            f"  fed by stoker:                      {result.step_stoker_s * 1e3:.1f} ms "
            f"(GPU idle {result.idle_stoker:.1%})",
            f"  fed by torch (seed config, pinned): {result.step_torch_s * 1e3:.1f} ms "
            f"(GPU idle {result.idle_torch:.1%})",
        ]
    )
