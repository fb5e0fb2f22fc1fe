"""Where measurements go: a jsonl log (versioned schema) and TensorBoard scalars.

jsonl schema ``stoker.watch`` version 1, one JSON object per line, told apart by ``kind``:

``header``   once per :func:`stoker.watch` object: ``schema``, ``version``, ``started_unix``,
             ``source`` (the iterable's type), ``num_workers``, ``every``.
``epoch``    each pass over the iterable, once its ``iter()`` returned: ``epoch`` (0-based),
             ``step`` (first step index), ``iter_s`` (the ``iter()`` call's time; absent in
             logs of earlier stoker versions, read as 0).
``step``     each step: ``step``, ``t`` (seconds from the run's start to the batch request),
             ``wait_s``, ``compute_s``, ``size`` (samples, or null).
``stall``    each stall: the fields of :class:`stoker.monitor.StallEvent`.
``interval`` each health interval: the fields of :class:`stoker.monitor.HealthReport`.
``summary``  at the end of each pass: the fields of :class:`stoker.monitor.WatchSummary`.

Readers ignore unknown kinds and unknown fields; a change that breaks readers bumps
``SCHEMA_VERSION``. The same path written twice by one process is appended to (one header per
watch object: ``stoker report`` shows them as consecutive segments); a path first written by
this process is truncated.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import threading
import time
from typing import IO, Any

from stoker.errors import ConfigError
from stoker.monitor._types import HealthReport, StallEvent, WatchSummary

__all__ = ["SCHEMA", "SCHEMA_VERSION", "JsonlSink", "TensorBoardSink", "to_json"]

SCHEMA = "stoker.watch"
SCHEMA_VERSION = 1
_BUFFER_BYTES = 1 << 20

# Paths this process has already opened: appended to, not truncated, on the next open.
_opened: set[str] = set()
_opened_lock = threading.Lock()


def to_json(record: Any) -> dict[str, Any]:
    """A dataclass record as a JSON-ready dict (tuples become lists)."""
    return dataclasses.asdict(record)


class JsonlSink:
    """Writes the run's records to a jsonl file.

    Args:
        path: file to write (parent directories are created).
        header: extra fields of the header record (source type, workers, ``every``);
            ``None`` writes no header (a later pass of the same run).

    Raises:
        ConfigError: when ``path`` cannot be opened for writing.
    """

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any] | None) -> None:
        real = os.path.realpath(os.fspath(path))
        with _opened_lock:
            mode = "a" if real in _opened else "w"
            _opened.add(real)
        try:
            os.makedirs(os.path.dirname(real) or ".", exist_ok=True)
            self._file: IO[str] = open(real, mode, buffering=_BUFFER_BYTES, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"`log` must be a writable file path. Found: {os.fspath(path)!r} ({exc})."
            ) from exc
        self.path = real
        if header is not None:
            self._write(
                {
                    "kind": "header",
                    "schema": SCHEMA,
                    "version": SCHEMA_VERSION,
                    "started_unix": time.time(),
                    **header,
                }
            )

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def epoch(self, epoch: int, step: int, iter_s: float) -> None:
        """Mark the start of a pass over the iterable, whose ``iter()`` took ``iter_s``."""
        self._write({"kind": "epoch", "epoch": epoch, "step": step, "iter_s": round(iter_s, 7)})

    def step(self, step: int, t: float, wait_s: float, compute_s: float, size: int | None) -> None:
        """Write one step (formatted by hand: this runs every step)."""
        self._file.write(
            f'{{"kind":"step","step":{step},"t":{t:.6f},"wait_s":{wait_s:.7f},'
            f'"compute_s":{compute_s:.7f},"size":{"null" if size is None else size}}}\n'
        )

    def stall(self, event: StallEvent) -> None:
        """Write one stall event."""
        self._write({"kind": "stall", **to_json(event)})

    def interval(self, report: HealthReport) -> None:
        """Write a health interval and flush, so the log is readable while training runs."""
        self._write({"kind": "interval", **to_json(report)})
        self._file.flush()

    def summary(self, summary: WatchSummary) -> None:
        """Write the summary of a pass and flush."""
        self._write({"kind": "summary", **to_json(summary)})
        self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        if not self._file.closed:
            self._file.close()


def tensorboard_available() -> bool:
    """Whether ``torch.utils.tensorboard`` can work (it needs the ``tensorboard`` package)."""
    return importlib.util.find_spec("tensorboard") is not None


class TensorBoardSink:
    """Writes health-interval scalars through ``torch.utils.tensorboard.SummaryWriter``.

    Scalars (``global_step`` = steps so far): ``stoker/data_wait_fraction``,
    ``stoker/samples_per_s``, ``stoker/steps_per_s``, ``stoker/wait_ms_per_step``,
    ``stoker/compute_ms_per_step``, ``stoker/stalls``, and when known ``stoker/worker_busy``,
    ``stoker/gpu_util``, ``stoker/reorder_depth``, ``stoker/slots_in_use``.

    Args:
        log_dir: the SummaryWriter's directory.
        writer: a writer with ``add_scalar``, ``flush`` and ``close`` to use instead of
            creating a SummaryWriter (for callers that already have one).

    Raises:
        ConfigError: when ``tensorboard`` is not installed.
    """

    @staticmethod
    def check(log_dir: str | os.PathLike[str]) -> None:
        """Raise :class:`ConfigError` now if ``tensorboard`` is not installed."""
        if not tensorboard_available():
            raise ConfigError(
                f"`tensorboard` was set to {os.fspath(log_dir)!r} but the `tensorboard` "
                "package is not installed: `pip install tensorboard` (or `stoker[monitor]`), "
                "or leave `tensorboard=None` and use `log=` (jsonl) instead."
            )

    def __init__(self, log_dir: str | os.PathLike[str], *, writer: Any = None) -> None:
        if writer is None:
            self.check(log_dir)
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=os.fspath(log_dir))
        self._writer = writer

    def interval(self, report: HealthReport) -> None:
        """Write one interval's scalars."""
        add, step = self._writer.add_scalar, report.step
        n = max(report.steps, 1)
        add("stoker/data_wait_fraction", report.wait_fraction, step)
        add("stoker/steps_per_s", report.steps_per_s, step)
        add("stoker/wait_ms_per_step", 1e3 * report.wait_s / n, step)
        add("stoker/compute_ms_per_step", 1e3 * report.compute_s / n, step)
        add("stoker/stalls", len(report.stalls), step)
        if report.samples_per_s is not None:
            add("stoker/samples_per_s", report.samples_per_s, step)
        health = report.loader
        if health is not None:
            for name, value in (
                ("worker_busy", health.busy_fraction),
                ("gpu_util", health.gpu_util),
                ("reorder_depth", health.reorder_depth),
                ("slots_in_use", health.slots_in_use),
            ):
                if value is not None:
                    add(f"stoker/{name}", value, step)
        self._writer.flush()

    def close(self) -> None:
        """Close the writer."""
        self._writer.close()
