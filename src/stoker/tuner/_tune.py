"""``stoker tune``: find a fast loader configuration for one dataset, offline.

The search over backend x workers x prefetch (x pinning on CUDA) is factored, because the
factors barely interact and a full cross product wastes most of its time on configurations
one measurement rules out:

1. **backend**: the ``backend="auto"`` probe (about a second, in a forked child) measures
   whether loading waits or computes and whether threads run it in parallel;
2. **workers**: loading in the main process, then a climb through worker counts (1 to 4 x the
   usable cores; to 16 x, at most 64, for threads chosen to cover waits) with that backend,
   all in one loader resized between short windows (see :mod:`stoker.tuner._measure`); the
   climb stops once counts past the one that keeps the cores busy gain nothing. For threads
   chosen to cover waits, the main process and the counts too few to keep one core busy
   through the waits the probe measured are skipped (see :func:`climb_start`); so is the main
   process for processes chosen for CPU work in batches of at least
   :data:`MAIN_PROCESS_MAX_BATCH_S`. The best two run twice as long;
3. **prefetch** (and pinning): the winning count with each other ``prefetch_factor`` (and
   ``pin_memory`` setting), measured as long as the last round.

Each round's winner is the cheapest configuration (fewest workers, shallowest prefetch, see
:func:`pick`) that loads within :data:`TIE_SHARE` of the fastest: closer rates than that are
as likely noise as a difference, and extra workers cost memory and start-up in every run.

A given ``space`` is searched by plain successive halving instead. The winner is compared with
torch's DataLoader defaults measured in the same run and written to ``stoker.toml``, which
``stoker.DataLoader(..., config="stoker.toml")`` applies.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.utils.data as tud
from torch.utils.data._utils.collate import default_collate

from stoker._introspect.platform import usable_cores
from stoker.autotune._probe import choose_backend_isolated
from stoker.errors import ConfigError
from stoker.loader._config import write_config
from stoker.tuner._measure import measure
from stoker.tuner._search import Round, Search
from stoker.tuner._space import (
    PREFETCH,
    Candidate,
    candidates,
    climb_start,
    pick,
    pins,
    ruled_out,
    worker_counts,
)

__all__ = [
    "Candidate",
    "TuneResult",
    "candidates",
    "climb_start",
    "measure",
    "pick",
    "tune",
    "worker_counts",
]

# Seconds of the first round per candidate; each later round doubles it.
FIRST_ROUND_S = 0.6


@dataclass
class TuneResult:
    """What ``tune`` found.

    Attributes:
        best: the winning configuration.
        best_rate: its samples/s in the last round.
        baseline_rate: torch's DataLoader defaults (``num_workers=0``), samples/s.
        rounds: per round, ``(seconds per candidate, [(candidate, samples/s), ...])``.
        seconds: wall time the search took.
        config_path: where ``stoker.toml`` was written (None if not written).
        notes: how the search went (the backend probe's answer and why).
    """

    best: Candidate
    best_rate: float
    baseline_rate: float
    rounds: list[Round] = field(default_factory=list)
    seconds: float = 0.0
    config_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.best_rate / self.baseline_rate if self.baseline_rate else math.inf


def _checked_dataset(dataset: Any, batch_size: int, budget_s: float) -> Any:
    if callable(dataset) and not isinstance(dataset, tud.Dataset):
        dataset = dataset()
    if isinstance(dataset, tud.IterableDataset) or not hasattr(dataset, "__len__"):
        raise ConfigError("`stoker tune` needs a map-style dataset (with `__len__`).")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"`batch_size` must be an int >= 1. Found: {batch_size!r}.")
    if budget_s <= 0:
        raise ConfigError(f"`budget_s` must be > 0. Found: {budget_s!r}.")
    return dataset


def _probed_space(
    search: Search, device: str | None, notes: list[str]
) -> tuple[list[Candidate], list[tuple[int, bool]]]:
    """The backend probe's answer as a space to climb, and the prefetch and pinning settings
    tried on the winner; the search's shared loader takes the probed backend."""
    probed: dict[str, Any] = {}
    backend, why = choose_backend_isolated(
        search.dataset, default_collate, search.batch_size, False, allow_inline=False, detail=probed
    )
    notes.append(f"backend={backend}: {why}")
    search.say(f"backend probe: {backend} ({why})")
    waits = backend == "thread" and bool(probed.get("waits"))
    counts, skipped = ruled_out(backend, probed, worker_counts(usable_cores(), waits=waits))
    space = [] if skipped else [Candidate("process", 0, 2)]
    if skipped:
        notes.append(f"not measured: {skipped}")
        search.say(notes[-1])
    space += [Candidate(backend, n, PREFETCH[0]) for n in counts]
    finals = [
        (pf, pin) for pf in PREFETCH for pin in pins(device) if (pf, pin) != (PREFETCH[0], False)
    ]
    search.session_backend = backend
    return space, finals


def tune(
    dataset: Any,
    batch_size: int,
    *,
    budget_s: float = 60.0,
    device: str | None = None,
    output: str | Path | None = "stoker.toml",
    space: list[Candidate] | None = None,
    report: Any = None,
) -> TuneResult:
    """Search for the fastest configuration of ``stoker.DataLoader`` for ``dataset``.

    Args:
        dataset: a map-style dataset (or a zero-argument factory returning one).
        batch_size: samples per batch.
        budget_s: seconds the search may take (it stops early when one candidate is left).
        device: ``"cuda"`` also tries pinned memory.
        output: path of the ``stoker.toml`` to write; None writes nothing.
        space: candidates to try (default :func:`candidates`).
        report: called as ``report(message)`` after each measurement (progress).

    Returns:
        A :class:`TuneResult`.

    Raises:
        ConfigError: for an iterable dataset, a bad ``batch_size`` or ``budget_s``.
    """
    dataset = _checked_dataset(dataset, batch_size, budget_s)
    notes: list[str] = []
    search = Search(dataset, batch_size, budget_s, report)
    finals: list[tuple[int, bool]] = []
    if space is None:
        space, finals = _probed_space(search, device, notes)
    try:
        scored = search.run(space, finals, FIRST_ROUND_S)
    finally:
        search.close()
    best, best_rate = pick(scored)
    baseline = measure(dataset, batch_size, None, FIRST_ROUND_S)
    search.say(f"torch defaults: {baseline:,.0f} samples/s")
    result = TuneResult(
        best, best_rate, baseline, search.rounds, time.perf_counter() - search.started, notes=notes
    )
    if output is not None:
        result.config_path = write_config(
            output,
            best.settings(),
            f"Written by `stoker tune` on {time.strftime('%Y-%m-%d %H:%M')}, batch size "
            f"{batch_size}, {usable_cores()} usable cores.\n"
            f"{best.label}: {best_rate:,.0f} samples/s, {result.speedup:.2f}x torch's "
            f"DataLoader defaults ({baseline:,.0f} samples/s), measured in the same run.",
        )
    return result
