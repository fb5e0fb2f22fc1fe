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

from stoker._introspect.platform import usable_cores
from stoker.errors import ConfigError
from stoker.loader._config import write_config
from stoker.tuner._measure import WorkerSession, measure

__all__ = ["Candidate", "TuneResult", "candidates", "climb_start", "measure", "pick", "tune"]

# Seconds of the first round per candidate; each later round doubles it.
FIRST_ROUND_S = 0.6
# The first round climbs worker counts and stops after CLIMB_PATIENCE counts in a row that did
# not beat the best so far by CLIMB_GAIN.
CLIMB_GAIN = 0.05
CLIMB_PATIENCE = 2
# The probe chose processes for CPU work that takes at least this long per batch: loading in
# the main process is not measured (processes load it about once per core as fast, less the
# main process's receiving, 0.8-1.2 ms a batch in `stoker bench`'s "main ms/batch").
MAIN_PROCESS_MAX_BATCH_S = 0.01
# Counts from the climb measured again, twice as long, before the prefetch round.
CLIMB_SURVIVORS = 2
# The winner is the cheapest configuration of the last round whose rate is within this share
# of the fastest: short windows on a shared machine differ by 5-10% from noise alone (jpeg on
# 2 cores, 0.6 s windows at 2 workers: 7-10% coefficient of variation), and a count the noise
# favoured costs memory and start-up in every run (8 processes on 2 cores: 93% of the grid's
# best in ``benchmarks/tune_vs_grid.py``).
TIE_SHARE = 0.05


@dataclass(frozen=True)
class Candidate:
    """One loader configuration."""

    backend: str
    num_workers: int
    prefetch_factor: int
    pin_memory: bool = False

    @property
    def label(self) -> str:
        pin = " pin" if self.pin_memory else ""
        if self.num_workers == 0:
            return f"main process nw=0{pin}"
        return f"{self.backend} nw={self.num_workers} pf={self.prefetch_factor}{pin}"

    def settings(self) -> dict[str, Any]:
        if self.num_workers == 0:  # no workers: no backend, no prefetch
            return {"num_workers": 0, "pin_memory": self.pin_memory}
        return {
            "backend": self.backend,
            "num_workers": self.num_workers,
            "prefetch_factor": self.prefetch_factor,
            "pin_memory": self.pin_memory,
        }


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
    rounds: list[tuple[float, list[tuple[Candidate, float]]]] = field(default_factory=list)
    seconds: float = 0.0
    config_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.best_rate / self.baseline_rate if self.baseline_rate else math.inf


PREFETCH = (2, 4)
# Most threads the climb tries when loading waits (see worker_counts).
WAITING_MOST = 64


def worker_counts(cores: int, waits: bool = False) -> list[int]:
    """Worker counts searched: 1 to 4 x cores, denser at the low end, and the core count.

    Args:
        cores: usable cores.
        waits: the probe chose threads to cover waits: counts go on to 16 x cores (at most
            64), as far as the climb finds them worth it (on the bench's ``io``, 2 cores:
            8 threads loaded 1,390 samples/s in ``benchmarks/tune_vs_grid.py``, 32
            auto-sized ones 2,485 in ``stoker bench``, separate runs).
    """
    most = max(4 * cores, min(WAITING_MOST, 16 * cores)) if waits else 4 * cores
    return sorted({n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if n <= most} | {cores})


def climb_start(cores: int, wait_share: float, counts: list[int]) -> int:
    """The first of ``counts`` the climb measures when threads were chosen to cover waits.

    Threads that wait a ``wait_share`` of their loading time keep at most ``1 - wait_share``
    of a core each: fewer than ``1 / (1 - wait_share)`` of them leave even one core (all the
    GIL allows work that holds it) idle part of the time, so each count below that loads
    slower than the next. The estimate ignores contention among the threads, so the start
    is capped at 2 x ``cores``; the climb then measures upwards from there.

    Args:
        cores: usable cores.
        wait_share: share of the loading time spent waiting, from the probe's serial pass.
        counts: the worker counts searched, ascending.
    """
    keep_one_busy = 1.0 / max(1e-3, 1.0 - min(max(wait_share, 0.0), 1.0))
    limit = max(1.0, min(keep_one_busy, 2.0 * cores))
    return max((n for n in counts if n <= limit), default=counts[0])


def _ruled_out(backend: str, probed: dict[str, Any], counts: list[int]) -> tuple[list[int], str]:
    """The worker counts worth measuring after the backend probe, and what the probe ruled
    out (``""``: nothing; else the main process, and for threads covering waits the counts
    below :func:`climb_start`), with why."""
    cores = usable_cores()
    if backend == "thread" and probed.get("waits"):
        # Loading waits and threads ran it in parallel: one loader in the main process cannot
        # keep up with them, nor can fewer threads than the climb's first count.
        wait_share = float(probed.get("wait_share", 0.0))
        first = climb_start(cores, wait_share, counts)
        return [n for n in counts if n >= first], (
            f"the main process and fewer than {first} threads (loading waits "
            f"{wait_share:.0%} of its time)"
        )
    batch_s = float(probed.get("batch_s", 0.0))
    if (
        backend == "process"
        and cores >= 2
        and batch_s >= MAIN_PROCESS_MAX_BATCH_S
        and not probed.get("copies")
    ):
        # CPU work that processes run in parallel, in batches that take far longer to load
        # than to receive: the main process alone cannot keep up with them.
        return counts, (
            f"the main process (a batch takes {batch_s * 1e3:,.0f} ms to load, CPU work that "
            f"processes spread over {cores} cores)"
        )
    return counts, ""


def _pins(device: str | None) -> tuple[bool, ...]:
    return (False, True) if device is not None and device.startswith("cuda") else (False,)


def candidates(cores: int, device: str | None = None) -> list[Candidate]:
    """The full space: both backends, workers 1..4 x cores, prefetch 2 and 4 (x pinning)."""
    return [
        Candidate(backend, n, pf, pin)
        for backend in ("process", "thread")
        for n in worker_counts(cores)
        for pf in PREFETCH
        for pin in _pins(device)
    ]


def _cost(cand: Candidate) -> tuple[int, ...]:
    """Order of preference among configurations that load about as fast: fewer workers,
    shallower prefetch, no pinning, threads (no process each); loading in the main process
    last (in training it does not overlap the step, which the search does not measure)."""
    return (
        cand.num_workers == 0,
        cand.num_workers,
        cand.prefetch_factor,
        cand.pin_memory,
        cand.backend != "thread",
    )


def pick(scored: list[tuple[Candidate, float]]) -> tuple[Candidate, float]:
    """The cheapest (:func:`_cost`) of ``scored`` whose rate is within :data:`TIE_SHARE` of
    the fastest's.

    Raises:
        ValueError: if ``scored`` is empty.
    """
    if not scored:
        raise ValueError("nothing was measured")
    fastest = max(rate for _, rate in scored)
    close = [cr for cr in scored if cr[1] >= fastest * (1 - TIE_SHARE)]
    return min(close, key=lambda cr: _cost(cr[0]))


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
    if callable(dataset) and not isinstance(dataset, tud.Dataset):
        dataset = dataset()
    if isinstance(dataset, tud.IterableDataset) or not hasattr(dataset, "__len__"):
        raise ConfigError("`stoker tune` needs a map-style dataset (with `__len__`).")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"`batch_size` must be an int >= 1. Found: {batch_size!r}.")
    if budget_s <= 0:
        raise ConfigError(f"`budget_s` must be > 0. Found: {budget_s!r}.")
    started = time.perf_counter()
    notes: list[str] = []
    rounds: list[tuple[float, list[tuple[Candidate, float]]]] = []

    # The probed backend's worker counts run in one loader, started when first needed (so
    # that its workers do not load beside a measurement in the main process).
    session: WorkerSession | None = None
    session_backend: str | None = None

    def rate_of(cand: Candidate, run_s: float) -> float:
        nonlocal session
        if cand.num_workers and cand.backend == session_backend and not cand.pin_memory:
            if session is None:
                session = WorkerSession(
                    dataset, batch_size, cand.backend, cand.num_workers, cand.prefetch_factor
                )
            return session.rate(cand.num_workers, cand.prefetch_factor, run_s)
        return measure(dataset, batch_size, cand, run_s)

    def measure_all(
        alive: list[Candidate], run_s: float, known: list[tuple[Candidate, float]] | None = None
    ) -> list[tuple[Candidate, float]]:
        scored = list(known or [])
        # In worker order, from the end nearer the session's count: each move then starts or
        # retires as few workers as it can.
        order = sorted(alive, key=lambda c: (c.num_workers, c.prefetch_factor))
        if session is not None and len(order) > 1:
            low, high = order[0].num_workers, order[-1].num_workers
            if abs(session.workers - high) < abs(session.workers - low):
                order.reverse()
        for cand in order:
            rate = rate_of(cand, run_s)
            scored.append((cand, rate))
            if report is not None:
                report(f"{cand.label}: {rate:,.0f} samples/s ({run_s:.1f} s)")
        scored.sort(key=lambda cr: cr[1], reverse=True)
        rounds.append((run_s, scored))
        return scored

    def climb(space: list[Candidate], run_s: float) -> list[tuple[Candidate, float]]:
        # Worker counts in rising order, until CLIMB_PATIENCE in a row gained nothing at or
        # past the count that keeps the cores busy (by the blocked share the workers
        # measured): beyond it, more workers only take turns. Short windows on heavy-tailed
        # loading gain nothing by chance, so the climb goes on until that count.
        scored, best, misses = [], 0.0, 0
        for cand in sorted(space, key=lambda c: c.num_workers):
            rate = rate_of(cand, run_s)
            scored.append((cand, rate))
            if report is not None:
                report(f"{cand.label}: {rate:,.0f} samples/s ({run_s:.1f} s)")
            if cand.num_workers == 0:
                continue  # the main process is not a step of the climb
            if rate >= best * (1 + CLIMB_GAIN):
                best, misses = max(best, rate), 0
            else:
                best, misses = max(best, rate), misses + 1
                need = session.fill_need() if session is not None else None
                if misses >= CLIMB_PATIENCE and need is not None and cand.num_workers >= need:
                    break
        scored.sort(key=lambda cr: cr[1], reverse=True)
        rounds.append((run_s, scored))
        return scored

    def fits(run_s: float, count: int) -> bool:
        # The next round must fit the budget, keeping time for torch's baseline.
        return time.perf_counter() - started + run_s * (count + 1) <= budget_s

    if space is None:
        from torch.utils.data._utils.collate import default_collate

        from stoker.autotune._probe import choose_backend_isolated

        probed: dict[str, Any] = {}
        backend, why = choose_backend_isolated(
            dataset, default_collate, batch_size, False, allow_inline=False, detail=probed
        )
        notes.append(f"backend={backend}: {why}")
        if report is not None:
            report(f"backend probe: {backend} ({why})")
        waits = backend == "thread" and bool(probed.get("waits"))
        counts, skipped = _ruled_out(backend, probed, worker_counts(usable_cores(), waits=waits))
        space = [] if skipped else [Candidate("process", 0, 2)]
        if skipped:
            notes.append(f"not measured: {skipped}")
            if report is not None:
                report(notes[-1])
        space += [Candidate(backend, n, PREFETCH[0]) for n in counts]
        finals = [
            (pf, pin)
            for pf in PREFETCH
            for pin in _pins(device)
            if (pf, pin) != (PREFETCH[0], False)
        ]
        session_backend = backend
    else:
        finals = []
    try:
        run_s = FIRST_ROUND_S
        if session_backend is not None:
            scored = climb(space, run_s)
        else:
            scored = measure_all(list(space), run_s)
        while len(scored) > 1:
            keep = len(scored) // 2
            if session_backend is not None and len(rounds) == 1:
                keep = min(keep, CLIMB_SURVIVORS)  # the climb already ranked the counts
            alive = [c for c, _ in scored[: max(1, keep)]]
            if len(alive) == 1 or not fits(2 * run_s, len(alive)):
                break
            run_s *= 2
            scored = measure_all(alive, run_s)
        top = pick(scored)
        if finals and top[0].num_workers > 0 and fits(run_s, len(finals) + 1):
            # The winner's rate from the last round stands (measured as long).
            variants = [
                Candidate(top[0].backend, top[0].num_workers, pf, pin) for pf, pin in finals
            ]
            scored = measure_all(variants, run_s, [top])
    finally:
        if session is not None:
            session.close()
    best, best_rate = pick(scored)
    baseline = measure(dataset, batch_size, None, FIRST_ROUND_S)
    if report is not None:
        report(f"torch defaults: {baseline:,.0f} samples/s")
    result = TuneResult(
        best, best_rate, baseline, rounds, time.perf_counter() - started, notes=notes
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
