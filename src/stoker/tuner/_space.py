"""The space ``stoker tune`` searches, and how it picks among configurations that load alike.

Pure functions of the machine's cores and the backend probe's answer; the measuring is in
:mod:`stoker.tuner._search`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stoker._introspect.platform import usable_cores

__all__ = [
    "PREFETCH",
    "Candidate",
    "candidates",
    "climb_start",
    "pick",
    "pins",
    "ruled_out",
    "worker_counts",
]

# The probe chose processes for CPU work that takes at least this long per batch: loading in
# the main process is not measured (processes load it about once per core as fast, less the
# main process's receiving of about a millisecond a batch).
MAIN_PROCESS_MAX_BATCH_S = 0.01
# The winner is the cheapest configuration of the last round whose rate is within this share
# of the fastest: short windows on a shared machine differ by 5-10% from noise alone, and a
# count the noise favoured costs memory and start-up in every run (``benchmarks/tune_vs_grid.py``).
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


PREFETCH = (2, 4)
# Most threads the climb tries when loading waits (see worker_counts).
WAITING_MOST = 64


def worker_counts(cores: int, waits: bool = False) -> list[int]:
    """Worker counts searched: 1 to 4 x cores, denser at the low end, and the core count.

    Args:
        cores: usable cores.
        waits: the probe chose threads to cover waits: counts go on to 16 x cores (at most
            64), as far as the climb finds them worth it (``benchmarks/tune_vs_grid.py``).
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


def ruled_out(backend: str, probed: dict[str, Any], counts: list[int]) -> tuple[list[int], str]:
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


def pins(device: str | None) -> tuple[bool, ...]:
    return (False, True) if device is not None and device.startswith("cuda") else (False,)


def candidates(cores: int, device: str | None = None) -> list[Candidate]:
    """The full space: both backends, workers 1..4 x cores, prefetch 2 and 4 (x pinning)."""
    return [
        Candidate(backend, n, pf, pin)
        for backend in ("process", "thread")
        for n in worker_counts(cores)
        for pf in PREFETCH
        for pin in pins(device)
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
