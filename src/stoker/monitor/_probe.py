"""Looks inside the watched loader at each health interval (never per step).

* stoker's ``DataLoader``: ``loader.stats()`` (a :class:`stoker.LoaderStats`); worker busy
  fraction over the interval comes from the change in each worker's ``busy_s``.
* torch's ``DataLoader`` with workers: the worker processes' CPU time over the interval
  (psutil), which misses time a worker spends blocked on I/O.
* both: PSS of each worker process (psutil, at most every ``PSS_MIN_INTERVAL_S``, read in a
  short-lived thread) and, with ``pynvml`` importable and CUDA available, GPU utilisation
  from NVML.

Intervals closer together than ``SAMPLE_MIN_INTERVAL_S`` reuse the last reading.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
from typing import Any

import psutil

from stoker.loader._stats import LoaderStats
from stoker.monitor._types import BusySource, LoaderHealth

__all__ = ["PSS_MIN_INTERVAL_S", "SAMPLE_MIN_INTERVAL_S", "LoaderProbe"]

# Reading PSS walks the process's page tables (milliseconds for a large worker).
PSS_MIN_INTERVAL_S = 5.0
# How long the end of a pass waits for a PSS reading under way.
PSS_JOIN_TIMEOUT_S = 2.0
# Health intervals closer together than this reuse the last sample: on a fast loader 100
# steps take a few milliseconds, and reading the loader 20 times a second costs more than
# the steps' own bookkeeping while telling nothing new.
SAMPLE_MIN_INTERVAL_S = 0.5


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


class _Gpu:
    """GPU utilisation through NVML; inert when ``pynvml`` or CUDA is missing."""

    def __init__(self) -> None:
        self._handle: Any = None
        self._nvml: Any = None
        if importlib.util.find_spec("pynvml") is None:
            return
        try:
            import pynvml
            import torch

            if not torch.cuda.is_available():
                return
            pynvml.nvmlInit()
            # NVML numbers devices physically; CUDA_VISIBLE_DEVICES may remap them.
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self._nvml = pynvml
        except Exception:  # NVML missing from the driver, no permission, ...
            self._handle = None

    def utilisation(self) -> float | None:
        if self._handle is None:
            return None
        try:
            return _clamp(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0)
        except Exception:
            return None


class LoaderProbe:
    """Samples the loader's internals at health intervals.

    Args:
        source: what :func:`stoker.watch` iterates (a loader or any iterable).
        gpu: query NVML for GPU utilisation when available. Default ``True``.
    """

    def __init__(self, source: Any, *, gpu: bool = True) -> None:
        stats = getattr(source, "stats", None)
        self._stats_fn = stats if callable(stats) else None
        workers = getattr(source, "num_workers", None)
        self.num_workers: int | None = workers if isinstance(workers, int) else None
        self._iterator: Any = None
        self._busy: dict[int, float] = {}
        self._cpu: dict[int, float] = {}
        self._last_time: float | None = None
        self._pss: tuple[int, ...] = ()
        self._pss_time: float | None = None
        self._pss_reader: threading.Thread | None = None
        self._gpu = _Gpu() if gpu else None

    @property
    def enabled(self) -> bool:
        """Whether sampling can tell anything beyond the step timings."""
        return bool(self._stats_fn or self.num_workers or (self._gpu and self._gpu._handle))

    def due(self, now: float) -> bool:
        """Whether a sample at time ``now`` would be new (``SAMPLE_MIN_INTERVAL_S`` apart)."""
        return self._last_time is None or now - self._last_time >= SAMPLE_MIN_INTERVAL_S

    def attach(self, iterator: Any) -> None:
        """Remember the iterator of the current pass (torch keeps its worker processes there)."""
        self._iterator = iterator

    def _loader_stats(self) -> LoaderStats | None:
        if self._stats_fn is None:
            return None
        try:
            stats = self._stats_fn()
        except Exception:
            return None
        return stats if isinstance(stats, LoaderStats) else None

    def _torch_pids(self) -> list[int]:
        procs = getattr(self._iterator, "_workers", None) or ()
        return [p.pid for p in procs if getattr(p, "pid", None)]

    def _busy_from_stats(self, stats: LoaderStats, dt: float | None) -> float | None:
        alive = [w for w in stats.workers if w.alive]
        if not alive:
            return None
        fractions = []
        for w in alive:
            before = self._busy.get(w.worker_id)
            if dt and before is not None and w.busy_s >= before:
                fractions.append(_clamp((w.busy_s - before) / dt))
            else:  # first sample or a restarted worker: its lifetime fraction
                fractions.append(_clamp(w.busy_fraction))
        self._busy = {w.worker_id: w.busy_s for w in stats.workers}
        return sum(fractions) / len(fractions)

    def _busy_from_cpu(self, pids: list[int], dt: float | None) -> float | None:
        fractions, seen = [], {}
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                t = proc.cpu_times()
                cpu = t.user + t.system
                before = self._cpu.get(pid)
                if dt and before is not None and cpu >= before:
                    fractions.append(_clamp((cpu - before) / dt))
                else:  # first sample: CPU share over the process's lifetime
                    fractions.append(_clamp(cpu / max(time.time() - proc.create_time(), 1e-3)))
            except (psutil.Error, OSError):
                continue
            seen[pid] = cpu
        self._cpu = seen
        return sum(fractions) / len(fractions) if fractions else None

    def _pss_of(self, pids: list[int], now: float) -> tuple[int, ...]:
        """The workers' PSS: the latest reading, and a new one started when it is due.

        Reading PSS makes the kernel walk each worker's page tables (milliseconds), so it
        runs in a thread: the kernel's walk releases the GIL, and the training loop does not
        wait for it. A health line shows the reading finished most recently.
        """
        reader = self._pss_reader
        if reader is not None and not reader.is_alive():
            self._pss_reader = reader = None
        due = self._pss_time is None or now - self._pss_time >= PSS_MIN_INTERVAL_S
        if due and reader is None:
            self._pss_time = now
            self._pss_reader = threading.Thread(
                target=self._read_pss, args=(tuple(pids),), name="stoker-watch-pss", daemon=True
            )
            self._pss_reader.start()
        return self._pss

    def _read_pss(self, pids: tuple[int, ...]) -> None:
        sizes = []
        for pid in pids:
            with contextlib.suppress(psutil.Error, OSError, AttributeError):
                sizes.append(int(psutil.Process(pid).memory_full_info().pss))
        self._pss = tuple(sizes)

    def close(self, timeout: float = PSS_JOIN_TIMEOUT_S) -> None:
        """Wait for a PSS reading under way (at the end of a pass: no thread outlives it)."""
        reader, self._pss_reader = self._pss_reader, None
        if reader is not None:
            reader.join(timeout)

    def sample(self, now: float) -> LoaderHealth | None:
        """Read the loader at time ``now`` (seconds, same clock as the previous call).

        Returns:
            A :class:`LoaderHealth`, or ``None`` when the source tells nothing.
        """
        dt = now - self._last_time if self._last_time is not None else None
        self._last_time = now
        gpu = self._gpu.utilisation() if self._gpu else None
        stats = self._loader_stats()
        if stats is not None:
            pids = [w.pid for w in stats.workers if w.pid and w.alive]
            return LoaderHealth(
                backend=stats.backend,
                num_workers=stats.num_workers,
                busy_fraction=self._busy_from_stats(stats, dt),
                busy_source="stats",
                outstanding=stats.outstanding,
                reorder_depth=stats.reorder_depth,
                slots=stats.slots,
                slots_in_use=stats.slots_in_use,
                failures=stats.failures,
                worker_restarts=stats.worker_restarts,
                off_shm_batches=stats.spilled_batches + stats.fallback_batches,
                pss_bytes=self._pss_of(pids, now) if pids else (),
                gpu_util=gpu,
            )
        if self.num_workers is None and gpu is None:
            return None
        pids = self._torch_pids()
        busy = self._busy_from_cpu(pids, dt) if pids else None
        source: BusySource | None = "cpu" if busy is not None else None
        return LoaderHealth(
            backend=("inline" if self.num_workers == 0 else "process")
            if self.num_workers is not None
            else None,
            num_workers=self.num_workers,
            busy_fraction=busy,
            busy_source=source,
            pss_bytes=self._pss_of(pids, now) if pids else (),
            gpu_util=gpu,
        )
