"""Health monitor: see data starvation while training, for stoker's loader and torch's.

``stoker.watch(loader)`` yields the loader's batches unchanged and measures, per step, the
time blocked waiting for data against the time spent computing; it prints a progress bar and
a health line with a diagnosis every ``every`` steps, and can log every step to jsonl (read by
``stoker report``) and interval scalars to TensorBoard.

Modules: ``_watch`` (the iteration loop), ``_meter`` (per-step accumulators, batch sizes),
``_detect`` (running median, stalls, sawtooth, diagnosis), ``_figures`` (the one definition of
a step, start-up, wall time, throughput and the verdict, for watch and report alike),
``_probe`` (loader stats, worker PSS/CPU, GPU), ``_sinks`` (jsonl schema, TensorBoard),
``_display`` (rich bar, plain lines), ``_report`` and ``_report_cli`` (``stoker report``).
"""

from __future__ import annotations

from stoker.monitor._types import (
    HealthReport,
    LoaderHealth,
    Sawtooth,
    StallEvent,
    WatchSummary,
)
from stoker.monitor._watch import Watch, watch

__all__ = [
    "HealthReport",
    "LoaderHealth",
    "Sawtooth",
    "StallEvent",
    "Watch",
    "WatchSummary",
    "watch",
]
