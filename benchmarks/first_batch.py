"""Time to the first batch, and to the N-th, of ``num_workers="auto"`` against torch's loader.

Each run is a fresh interpreter (nothing warm: imports done, dataset built, then the clock
starts before the loader is built), contenders alternating, ``--runs`` runs each; printed are
the medians of the time to the first batch and to ``--batches`` batches, and the backend the
auto loader chose. Contenders are those of ``_common.contender`` (``auto``, ``torchN``, ...).
With ``--device cuda`` a batch counts once it is on the GPU (stoker's ``device=``; torch's
loaders pin, and each batch is copied with ``non_blocking=True``), the device synchronized.

Run: ``python benchmarks/first_batch.py jpeg auto torch0 torch2 [--device cuda]``
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
from _common import contender, contenders_parser, open_workload
from torch.utils._pytree import tree_map

import stoker
from stoker._commands.step import consume
from stoker.bench._plan import SeededSampler


def on_device(batch: Any, device: str | None, copy: bool) -> Any:
    """``batch`` once on ``device`` (copied there if ``copy``), the device synchronized."""
    if device is None:
        return batch
    if copy:
        batch = tree_map(
            lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t,
            batch,
        )
    torch.cuda.synchronize(device)
    return batch


def one_run(
    workload: str, kind: str, batches: int, shuffled: bool, device: str | None = None
) -> dict[str, object]:
    """In this interpreter: seconds to the first and the ``batches``-th batch."""
    w, dataset = open_workload(workload)
    sampler: Any = list(range(len(dataset)))
    if shuffled:  # the bench's order (a seeded permutation), as shuffle=True gives
        sampler = SeededSampler(len(dataset), len(dataset), seed=1)
    t0 = time.perf_counter()
    loader = contender(kind, dataset, w.batch_size, sampler, device)
    copy = not isinstance(loader, stoker.DataLoader)  # (stoker's deliver on the device)
    it = iter(loader)
    consume(on_device(next(it), device, copy))
    first = time.perf_counter() - t0
    for _ in range(batches - 1):
        consume(on_device(next(it), device, copy))
    nth = time.perf_counter() - t0
    stats = getattr(loader, "stats", None)
    notes = stats().notes if callable(stats) else []
    backend = getattr(loader, "_resolved_backend", "")
    head = any("beside the backend probe" in note for note in notes)  # stoker.loader._head
    main = any("in the main process" in note for note in notes)  # stoker.loader._main_first
    return {
        "first": first,
        "nth": nth,
        "backend": backend,
        "notes": notes[:1],
        "head": head,
        "main": main,
    }


def main() -> None:
    parser = contenders_parser(__doc__ or "")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument(
        "--shuffled", action="store_true", help="a seeded random order instead of 0, 1, 2, ..."
    )
    parser.add_argument("--device", default=None, help="e.g. cuda: time batches on the GPU")
    parser.add_argument("--child", action="store_true", help=argparse_hidden())
    args = parser.parse_args()
    if args.child:
        result = one_run(
            args.workload, args.contenders[0], args.batches, args.shuffled, args.device
        )
        print(json.dumps(result, default=str))
        return
    found: dict[str, list[dict[str, object]]] = {kind: [] for kind in args.contenders}
    for _ in range(args.runs):
        for kind in args.contenders:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    args.workload,
                    kind,
                    "--child",
                    "--batches",
                    str(args.batches),
                    *(["--shuffled"] if args.shuffled else []),
                    *(["--device", args.device] if args.device else []),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            found[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.workload}: medians of {args.runs} fresh interpreters")
    for kind, runs in found.items():
        first = statistics.median(float(r["first"]) for r in runs)  # type: ignore[arg-type]
        nth = statistics.median(float(r["nth"]) for r in runs)  # type: ignore[arg-type]
        firsts = " ".join(f"{1e3 * float(r['first']):.1f}" for r in runs)  # type: ignore[arg-type]
        backends = sorted({str(r["backend"]) for r in runs})
        heads = sum(bool(r.get("head")) for r in runs)
        mains = sum(bool(r.get("main")) for r in runs)
        print(
            f"  {kind:<10} first batch {1e3 * first:7.1f} ms  {args.batches} batches {nth:6.3f} s  "
            f"(firsts, ms: {firsts}) {','.join(b for b in backends if b)}"
            + (f", head start in {heads} of {len(runs)}" if heads else "")
            + (f", main process's first batch in {mains} of {len(runs)}" if mains else ""),
            flush=True,
        )


def argparse_hidden() -> str:
    return "run one contender in this interpreter and print JSON (internal)"


if __name__ == "__main__":
    main()
