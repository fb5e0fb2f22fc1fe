"""One ``stoker tune`` search: its rounds of measurements and the loader its worker counts share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stoker.tuner._measure import WorkerSession, measure
from stoker.tuner._space import Candidate, pick

__all__ = ["Round", "Scored", "Search"]

# The first round climbs worker counts and stops after CLIMB_PATIENCE counts in a row that did
# not beat the best so far by CLIMB_GAIN.
CLIMB_GAIN = 0.05
CLIMB_PATIENCE = 2
# Counts from the climb measured again, twice as long, before the prefetch round.
CLIMB_SURVIVORS = 2

Scored = list[tuple[Candidate, float]]
Round = tuple[float, Scored]


class Search:
    """Measures candidates for one dataset within a time budget, keeping every round.

    The probed backend's worker counts run in one loader resized between windows, started when
    first needed so that its workers do not load beside a measurement in the main process.

    Args:
        dataset: the map-style dataset.
        batch_size: samples per batch.
        budget_s: seconds the whole search may take, torch's baseline included.
        report: called as ``report(message)`` after each measurement, or None.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        budget_s: float,
        report: Callable[[str], object] | None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.budget_s = budget_s
        self.report = report
        self.started = time.perf_counter()
        self.rounds: list[Round] = []
        self.session: WorkerSession | None = None
        self.session_backend: str | None = None

    def say(self, message: str) -> None:
        if self.report is not None:
            self.report(message)

    def rate_of(self, cand: Candidate, run_s: float) -> float:
        """``cand``'s samples/s over a window of ``run_s`` seconds."""
        if cand.num_workers and cand.backend == self.session_backend and not cand.pin_memory:
            if self.session is None:
                self.session = WorkerSession(
                    self.dataset,
                    self.batch_size,
                    cand.backend,
                    cand.num_workers,
                    cand.prefetch_factor,
                )
            rate = self.session.rate(cand.num_workers, cand.prefetch_factor, run_s)
        else:
            rate = measure(self.dataset, self.batch_size, cand, run_s)
        self.say(f"{cand.label}: {rate:,.0f} samples/s ({run_s:.1f} s)")
        return rate

    def _close_round(self, scored: Scored, run_s: float) -> Scored:
        scored.sort(key=lambda cr: cr[1], reverse=True)
        self.rounds.append((run_s, scored))
        return scored

    def measure_all(
        self, alive: list[Candidate], run_s: float, known: Scored | None = None
    ) -> Scored:
        """One round over ``alive`` (plus ``known`` rates), fastest first."""
        scored = list(known or [])
        # In worker order, from the end nearer the session's count: each move then starts or
        # retires as few workers as it can.
        order = sorted(alive, key=lambda c: (c.num_workers, c.prefetch_factor))
        if self.session is not None and len(order) > 1:
            low, high = order[0].num_workers, order[-1].num_workers
            if abs(self.session.workers - high) < abs(self.session.workers - low):
                order.reverse()
        scored += [(cand, self.rate_of(cand, run_s)) for cand in order]
        return self._close_round(scored, run_s)

    def climb(self, space: list[Candidate], run_s: float) -> Scored:
        """Worker counts in rising order, until CLIMB_PATIENCE in a row gained nothing at or
        past the count that keeps the cores busy (by the blocked share the workers measured):
        beyond it, more workers only take turns, and short windows on heavy-tailed loading
        gain nothing by chance before it."""
        scored: Scored = []
        best, misses = 0.0, 0
        for cand in sorted(space, key=lambda c: c.num_workers):
            rate = self.rate_of(cand, run_s)
            scored.append((cand, rate))
            if cand.num_workers == 0:
                continue  # the main process is not a step of the climb
            misses = 0 if rate >= best * (1 + CLIMB_GAIN) else misses + 1
            best = max(best, rate)
            if misses >= CLIMB_PATIENCE and self.session is not None:
                need = self.session.fill_need()
                if need is not None and cand.num_workers >= need:
                    break
        return self._close_round(scored, run_s)

    def fits(self, run_s: float, count: int) -> bool:
        """Whether a round of ``count`` windows of ``run_s`` fits the budget, keeping time for
        torch's baseline."""
        return time.perf_counter() - self.started + run_s * (count + 1) <= self.budget_s

    def run(
        self, space: list[Candidate], finals: list[tuple[int, bool]], first_round_s: float
    ) -> Scored:
        """The rounds: a climb (probed backend) or a plain round, then successive halving
        with windows twice as long, then the winner's other prefetch and pinning settings.

        Returns:
            The last round's rates, fastest first.
        """
        run_s = first_round_s
        if self.session_backend is not None:
            scored = self.climb(space, run_s)
        else:
            scored = self.measure_all(list(space), run_s)
        while len(scored) > 1:
            keep = len(scored) // 2
            if self.session_backend is not None and len(self.rounds) == 1:
                keep = min(keep, CLIMB_SURVIVORS)  # the climb already ranked the counts
            alive = [c for c, _ in scored[: max(1, keep)]]
            if len(alive) == 1 or not self.fits(2 * run_s, len(alive)):
                break
            run_s *= 2
            scored = self.measure_all(alive, run_s)
        top = pick(scored)
        if finals and top[0].num_workers > 0 and self.fits(run_s, len(finals) + 1):
            # The winner's rate from the last round stands (measured as long).
            variants = [
                Candidate(top[0].backend, top[0].num_workers, pf, pin) for pf, pin in finals
            ]
            scored = self.measure_all(variants, run_s, [top])
        return scored

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
