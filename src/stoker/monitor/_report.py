"""Read a ``stoker.watch`` jsonl log back: summary and timeline plot (``stoker report``).

The summary is recomputed from the step records with the same detectors the live monitor
uses, so it is exact (the live summary's percentiles come from a histogram).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from stoker._introspect.platform import usable_cores
from stoker.errors import ConfigError
from stoker.monitor._detect import StallDetector, percentile, scan_sawtooth
from stoker.monitor._figures import Figures, judge
from stoker.monitor._records import LogRecords, identify
from stoker.monitor._sinks import SCHEMA, SCHEMA_VERSION
from stoker.monitor._types import LoaderHealth, StallEvent, WatchSummary

__all__ = ["RunLog", "load_run", "summarize"]


@dataclass(frozen=True)
class RunLog:
    """The step series of a jsonl log, segments and epochs concatenated in file order.

    Attributes:
        path: the file read.
        t: start of each step (seconds, continuous across segments and epochs).
        wait: per-step data wait (s); ``compute``: per-step compute (s).
        size: per-step samples (NaN where unknown).
        epoch_starts: indices of the first step of each pass after the first.
        headers: the header records (one per watch object).
        intervals: the interval records, ``step`` made continuous.
        summaries: the summary records as written.
        every: steps per health interval (from the first header).
        num_workers: from the first header.
        iter_s: the passes' ``iter()`` calls, summed (0 in logs of earlier versions).
    """

    path: str
    t: np.ndarray
    wait: np.ndarray
    compute: np.ndarray
    size: np.ndarray
    epoch_starts: tuple[int, ...] = ()
    headers: tuple[dict[str, Any], ...] = ()
    intervals: tuple[dict[str, Any], ...] = ()
    summaries: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    every: int = 100
    num_workers: int | None = None
    iter_s: float = 0.0

    @property
    def steps(self) -> int:
        """Number of steps."""
        return len(self.wait)

    @property
    def pass_starts(self) -> tuple[int, ...]:
        """The first step of each pass (the first pass's included)."""
        return tuple(sorted({0, *(i for i in self.epoch_starts if i < self.steps)}))

    def figures(self) -> Figures:
        """The run's :class:`Figures` (the definitions the live watch uses)."""
        first = list(self.pass_starts)
        startup_wait = float(self.wait[first].sum())
        startup_compute = float(self.compute[first].sum())
        wait, compute = float(self.wait.sum()), float(self.compute.sum())
        sized = not bool(np.isnan(self.size).any())
        return Figures(
            steps=self.steps,
            samples=int(self.size.sum()) if sized else None,
            wait_s=wait,
            compute_s=compute,
            startup_s=self.iter_s + startup_wait,
            steady_steps=self.steps - len(first),
            steady_wait_s=wait - startup_wait,
            steady_compute_s=compute - startup_compute,
            wall_s=self.iter_s + wait + compute,
        )


class _Reader:
    """Turns a log's records into the series of a :class:`RunLog`, one record at a time."""

    def __init__(self, records: LogRecords) -> None:
        self.records = records
        self.t: list[float] = []
        self.wait: list[float] = []
        self.compute: list[float] = []
        self.size: list[float] = []
        self.headers: list[dict[str, Any]] = []
        self.intervals: list[dict[str, Any]] = []
        self.summaries: list[dict[str, Any]] = []
        self.epoch_starts: list[int] = []
        self.iter_s = 0.0
        self.step_base = 0  # steps before the current watch object (segment)
        self.t_base = 0.0

    def add(self, rec: dict[str, Any]) -> None:
        """Take one record (its ``kind`` already checked to be a string)."""
        records, kind = self.records, rec["kind"]
        if kind == "header":
            self._header(rec)
        elif kind == "step":
            self.t.append(self.t_base + records.number(rec, "t"))
            self.wait.append(records.number(rec, "wait_s"))
            self.compute.append(records.number(rec, "compute_s"))
            s = records.count(rec, "size", optional=True)
            self.size.append(float("nan") if s is None else float(s))
        elif kind == "epoch":
            step = records.count(rec, "step")
            if "iter_s" in rec:  # absent in logs of earlier versions
                self.iter_s += records.number(rec, "iter_s")
            if step or len(self.headers) > 1:
                self.epoch_starts.append(self.step_base + (step or 0))
        elif kind == "interval":
            step = records.count(rec, "step")
            loader = records.loader(rec)
            self.intervals.append({**rec, "step": self.step_base + (step or 0), "loader": loader})
        elif kind == "summary":
            self.summaries.append(rec)

    def _header(self, rec: dict[str, Any]) -> None:
        records = self.records
        if rec.get("schema") != SCHEMA:
            raise records.bad(
                f"not a `stoker.watch` log (schema {rec.get('schema')!r}, expected {SCHEMA!r})"
            )
        version = rec.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise records.field_error("header", "version", "an int >= 1", version)
        if version > SCHEMA_VERSION:
            raise records.bad(
                f"schema version {version} is newer than {SCHEMA_VERSION}, the one this "
                "stoker reads: upgrade stoker"
            )
        records.count(rec, "every", minimum=1, optional=True)
        records.count(rec, "num_workers", optional=True)
        t, wait, compute = self.t, self.wait, self.compute
        self.step_base = len(wait)
        self.t_base = t[-1] + wait[-1] + compute[-1] if t else 0.0
        self.headers.append(rec)

    def run(self) -> RunLog:
        """The :class:`RunLog` of the records taken."""
        first = self.headers[0]
        return RunLog(
            path=self.records.path,
            t=np.asarray(self.t),
            wait=np.asarray(self.wait),
            compute=np.asarray(self.compute),
            size=np.asarray(self.size),
            epoch_starts=tuple(sorted(set(self.epoch_starts))),
            headers=tuple(self.headers),
            intervals=tuple(self.intervals),
            summaries=tuple(self.summaries),
            every=int(first.get("every") or 100),
            num_workers=first.get("num_workers"),
            iter_s=self.iter_s,
        )


def load_run(path: str | os.PathLike[str]) -> RunLog:
    """Read a jsonl log written by :func:`stoker.watch` (``log=``).

    The file is untrusted input: every field used is checked for its type and range as its
    line is read (see :mod:`stoker.monitor._records`).

    Args:
        path: the jsonl file.

    Returns:
        The :class:`RunLog`.

    Raises:
        ConfigError: when the file is missing, is not a ``stoker.watch`` log (saying what it is
            when it says: a ``stoker bench`` result, say), has a newer schema version than this
            stoker reads, holds a record with a field of the wrong type or range (naming the
            line), or holds no steps.
    """
    name = os.fspath(path)
    try:
        handle = open(name, "rb")  # decoded line by line, so that bad bytes name their line
    except OSError as exc:
        raise ConfigError(f"cannot read the log {name!r}: {exc.strerror or exc}.") from exc
    records = LogRecords(name)
    reader = _Reader(records)
    with handle:
        for lineno, raw in enumerate(handle, 1):
            records.line = lineno
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if lineno > 1 and not raw.endswith(b"\n"):
                    break  # torn mid-character by a killed run
                raise _not_a_log(records, f"not UTF-8 text ({exc.reason})") from exc
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:  # JSONDecodeError, or a number too long to convert
                if lineno > 1 and not line.endswith("\n"):
                    break  # a run killed mid-write: keep what came before the torn line
                raise _not_a_log(records, f"invalid JSON: {getattr(exc, 'msg', exc)}") from exc
            kind = rec.get("kind") if isinstance(rec, dict) else None
            if not isinstance(kind, str) or (lineno == 1 and kind != "header"):
                raise _not_a_log(records, "no `kind` header record")
            reader.add(rec)
    if not reader.wait:
        raise ConfigError(f"{name}: the log holds no steps (was the watched loop run?).")
    return reader.run()


def _not_a_log(records: LogRecords, why: str) -> ConfigError:
    """The file is not a ``stoker.watch`` log: say what it is, when it says."""
    identity = identify(records.path)
    if identity is not None:
        return ConfigError(
            f"{records.path} is {identity}, not a `stoker.watch` log: `stoker report` reads the "
            "jsonl file that `stoker.watch(..., log=PATH)` writes."
        )
    return records.bad(f"not a `stoker.watch` log ({why})")


def _loader_health(record: dict[str, Any] | None) -> LoaderHealth | None:
    if not record:
        return None
    names = {f.name for f in fields(LoaderHealth)}
    values = {k: v for k, v in record.items() if k in names}
    if "pss_bytes" in values:
        values["pss_bytes"] = tuple(values["pss_bytes"] or ())
    return LoaderHealth(**values)


def find_stalls(run: RunLog) -> tuple[StallEvent, ...]:
    """Re-run stall detection over the whole log (same rule as the live monitor)."""
    detector = StallDetector()
    starts = set(run.epoch_starts)
    events = []
    for i, w in enumerate(run.wait.tolist()):
        event = detector.check(i, w, epoch_start=i in starts)
        if event is not None:
            events.append(event)
    return tuple(events)


def summarize(run: RunLog, *, cores: int | None = None) -> WatchSummary:
    """The run's summary, recomputed from its steps.

    Args:
        run: a loaded log.
        cores: usable cores for the advice. Default: this machine's.

    Returns:
        A :class:`WatchSummary`.
    """
    wait = run.wait.tolist()
    compute = run.compute.tolist()
    figures = run.figures()
    stalls = find_stalls(run)
    saw = scan_sawtooth(wait, compute)
    last = run.intervals[-1] if run.intervals else None
    verdict = judge(
        figures,
        loader=_loader_health(last.get("loader") if last else None),
        num_workers=run.num_workers,
        sawtooth=saw,
        stalls=stalls,
        cores=cores or usable_cores(),
    )
    return WatchSummary(
        steps=run.steps,
        samples=figures.samples,
        elapsed_s=figures.wall_s,
        wait_s=figures.wait_s,
        compute_s=figures.compute_s,
        wait_fraction=figures.wait_fraction,
        samples_per_s=figures.samples_per_s,
        median_wait_s=percentile(wait, 50),
        p95_wait_s=percentile(wait, 95),
        max_wait_s=max(wait),
        median_compute_s=percentile(compute, 50),
        verdict=verdict.verdict,
        diagnosis=verdict.diagnosis,
        action=verdict.action,
        stalls=stalls,
        sawtooth=saw,
        startup_s=figures.startup_s,
        steady_steps=figures.steady_steps,
        evidence=verdict.evidence,
    )
