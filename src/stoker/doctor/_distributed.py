"""Distributed-training checks (SK5xx): what goes wrong when a script runs under torchrun.

Static checks read the script (SK501, SK502); the runtime check compares ``LOCAL_RANK`` with
the CUDA device this process uses (SK503). Worker processes that oversubscribe the node's
cores across its ranks are SK202 (``_resources``, with ``LOCAL_WORLD_SIZE``). SK011 (missing
``set_epoch``) is silenced here for a stoker loader with ``distributed=True``, which calls it.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from stoker._introspect.script import Script
from stoker.doctor._finding import Finding, Severity

__all__ = [
    "DISTRIBUTED_CHECKS",
    "check_local_rank_device",
    "loader_drives_epoch",
    "local_rank_device",
]

_RANK_AWARE_SAMPLERS = frozenset({"DistributedSampler", "RankSampler"})
_DDP_MARKERS = ("init_process_group", "DistributedDataParallel")


def _distributed_loader(script: Script) -> list[ast.Call]:
    return [
        c.node
        for c in script.loaders
        if c.from_stoker and script.bool_value(c.args.get("distributed")) is True
    ]


def loader_drives_epoch(script: Script) -> bool:
    """True when a stoker loader with ``distributed=True`` calls ``set_epoch`` itself."""
    return bool(_distributed_loader(script))


def _is_ddp(script: Script) -> ast.Call | None:
    for name in _DDP_MARKERS:
        calls = script.calls(name)
        if calls:
            return calls[0]
    return None


def _check_unsharded_loader(script: Script) -> Iterator[Finding]:
    """SK501: a DDP script whose loader has no rank-aware sampler (every rank loads it all)."""
    ddp = _is_ddp(script)
    if ddp is None:
        return
    aware = {n.lineno for name in _RANK_AWARE_SAMPLERS for n in script.calls(name)}
    for call in script.loaders:
        if call.from_stoker and script.bool_value(call.args.get("distributed")) is True:
            continue
        if "sampler" in call.args or "batch_sampler" in call.args or aware:
            continue
        yield Finding(
            "SK501",
            Severity.WARNING,
            "A distributed script's DataLoader is not split over the ranks",
            f"line {call.line}: `{script.segment(call.node)}` in a script that calls "
            f"`{script.segment(ddp.func)}` (line {ddp.lineno}), with no `DistributedSampler`",
            "Without a rank-aware sampler every rank loads the whole dataset: an epoch is "
            "world_size times longer and ranks train on the same samples.",
            "loader = stoker.DataLoader(ds, batch_size=..., shuffle=True, distributed=True)",
            script.where(call.node),
        )


def _check_cuda_without_local_rank(script: Script) -> Iterator[Finding]:
    """SK502: a DDP script that picks a CUDA device without reading LOCAL_RANK."""
    ddp = _is_ddp(script)
    if ddp is None or "LOCAL_RANK" in script.source or "local_rank" in script.source:
        return
    if script.calls("set_device"):
        return
    for node in ast.walk(script.tree):
        if isinstance(node, ast.Constant) and node.value in ("cuda", "cuda:0"):
            yield Finding(
                "SK502",
                Severity.ERROR,
                "Every rank uses the same GPU",
                f"line {node.lineno}: device {node.value!r} in a distributed script that never "
                "reads `LOCAL_RANK` or calls `torch.cuda.set_device`",
                "torchrun starts one process per GPU and tells each its GPU in `LOCAL_RANK`; "
                "'cuda' means GPU 0 for all of them, which runs out of memory or crawls while "
                "the other GPUs idle (NCCL may also hang).",
                'local_rank = int(os.environ["LOCAL_RANK"])\n'
                "torch.cuda.set_device(local_rank)\n"
                'device = torch.device("cuda", local_rank)',
                script.where(node),
            )
            return


DISTRIBUTED_CHECKS = (_check_unsharded_loader, _check_cuda_without_local_rank)


def check_local_rank_device(
    *, local_rank: int | None, cuda_initialized: bool, current_device: int, device_count: int
) -> list[Finding]:
    """SK503: this process's current CUDA device is not its ``LOCAL_RANK``.

    Pure: every reading is an argument (see :func:`local_rank_device` for the live ones).
    """
    if local_rank is None or not cuda_initialized or device_count < 2:
        return []
    expected = local_rank % device_count
    if current_device == expected:
        return []
    return [
        Finding(
            "SK503",
            Severity.ERROR,
            "This rank's CUDA device does not match its LOCAL_RANK",
            f"LOCAL_RANK={local_rank} but the current CUDA device is {current_device} "
            f"({device_count} devices visible)",
            "Ranks sharing a GPU run out of memory or crawl while other GPUs idle; batches "
            "copied with `device='cuda'` go to the wrong GPU.",
            'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # before building the model',
            "torch.cuda.current_device()",
        )
    ]


def local_rank_device() -> list[Finding]:
    """SK503 with this process's readings (no finding without ``LOCAL_RANK`` or CUDA)."""
    import torch

    raw = os.environ.get("LOCAL_RANK")
    if raw is None or not raw.isdigit() or not torch.cuda.is_available():
        return []
    initialized = torch.cuda.is_initialized()
    return check_local_rank_device(
        local_rank=int(raw),
        cuda_initialized=initialized,
        current_device=torch.cuda.current_device() if initialized else 0,
        device_count=torch.cuda.device_count(),
    )
