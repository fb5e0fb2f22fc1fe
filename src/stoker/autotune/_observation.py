"""What the ``num_workers="auto"`` controller is fed each interval, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Decision", "Observation"]


@dataclass(frozen=True)
class Observation:
    """What happened during one interval.

    Attributes:
        wall_s: length of the interval.
        wait_s: time the consumer spent blocked in ``next()``.
        busy_s: time all workers together spent loading batches.
        cpu_s: CPU time the workers used (None if unknown).
        workers: workers running during the interval.
        cores: usable cores (affinity and cgroup quota).
        latency_p50_s: median batch load time, if any batch completed.
        latency_p95_s: 95th percentile batch load time.
        memory_ok: whether one more worker fits the memory budget.
        batches: batches delivered to the consumer during the interval.
        settling: workers started during the interval (their start-up skews the figures:
            the interval is not used for a decision).
        idle_cores: idle CPU time of the usable cores over the interval, in cores (other
            processes on the machine count); None if unknown.
        blocked_s: over the spans of worker batches sampled during the interval, the loading
            time spent neither running nor waiting for a core (asleep on storage, a network,
            a lock); None if no span was sampled.
        running_s: over the same spans, the loading time spent on a core.
        sampled: how many spans ``blocked_s`` and ``running_s`` cover.
        consumer_cpu_s: CPU time the main process used (the training loop, and receiving
            batches from process workers); None if unknown (thread workers share it).
        limited: a start-up dispatch window, not the worker count, limited the batches in
            flight (workers are not added then: the window grows first).
    """

    wall_s: float
    wait_s: float
    busy_s: float
    cpu_s: float | None
    workers: int
    cores: int
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    memory_ok: bool = True
    batches: int = 0
    settling: bool = False
    idle_cores: float | None = None
    blocked_s: float | None = None
    running_s: float | None = None
    sampled: int = 0
    limited: bool = False
    consumer_cpu_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """What to run next, and why (shown in the stats and the monitor)."""

    workers: int
    prefetch: int
    reason: str
