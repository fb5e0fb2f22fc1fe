"""Read a ``stoker.watch`` jsonl log back: summary and timeline plot (``stoker report``).

The summary is recomputed from the step records with the same detectors the live monitor
uses, so it is exact (the live summary's percentiles come from a histogram).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from stoker._introspect.platform import usable_cores
from stoker.errors import ConfigError
from stoker.monitor._detect import (
    StallDetector,
    diagnose,
    percentile,
    scan_sawtooth,
    wait_fraction,
)
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

    @property
    def steps(self) -> int:
        """Number of steps."""
        return len(self.wait)


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
    t: list[float] = []
    wait: list[float] = []
    compute: list[float] = []
    size: list[float] = []
    headers: list[dict[str, Any]] = []
    intervals: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    epoch_starts: list[int] = []
    step_base = 0  # steps before the current watch object (segment)
    t_base = 0.0
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
            if kind == "header":
                if rec.get("schema") != SCHEMA:
                    raise records.bad(
                        f"not a `stoker.watch` log (schema {rec.get('schema')!r}, expected "
                        f"{SCHEMA!r})"
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
                step_base = len(wait)
                t_base = t[-1] + wait[-1] + compute[-1] if t else 0.0
                headers.append(rec)
            elif kind == "step":
                t.append(t_base + records.number(rec, "t"))
                wait.append(records.number(rec, "wait_s"))
                compute.append(records.number(rec, "compute_s"))
                s = records.count(rec, "size", optional=True)
                size.append(float("nan") if s is None else float(s))
            elif kind == "epoch":
                step = records.count(rec, "step")
                if step or len(headers) > 1:
                    epoch_starts.append(step_base + (step or 0))
            elif kind == "interval":
                step = records.count(rec, "step")
                loader = records.loader(rec)
                intervals.append({**rec, "step": step_base + (step or 0), "loader": loader})
            elif kind == "summary":
                summaries.append(rec)
    if not wait:
        raise ConfigError(f"{name}: the log holds no steps (was the watched loop run?).")
    first = headers[0]
    return RunLog(
        path=name,
        t=np.asarray(t),
        wait=np.asarray(wait),
        compute=np.asarray(compute),
        size=np.asarray(size),
        epoch_starts=tuple(sorted(set(epoch_starts))),
        headers=tuple(headers),
        intervals=tuple(intervals),
        summaries=tuple(summaries),
        every=int(first.get("every") or 100),
        num_workers=first.get("num_workers"),
    )


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
    total_wait, total_compute = float(run.wait.sum()), float(run.compute.sum())
    frac = wait_fraction(total_wait, total_compute)
    # Wall time: each pass from its first request to the end of its last step.
    bounds = [0, *run.epoch_starts, run.steps]
    elapsed = 0.0
    for a, b in itertools.pairwise(bounds):
        if b > a:
            elapsed += float(run.t[b - 1] + run.wait[b - 1] + run.compute[b - 1] - run.t[a])
    sized = not bool(np.isnan(run.size).any())
    samples = int(run.size.sum()) if sized else None
    stalls = find_stalls(run)
    saw = scan_sawtooth(wait, compute)
    last = run.intervals[-1] if run.intervals else None
    verdict, text, action = diagnose(
        frac,
        loader=_loader_health(last.get("loader") if last else None),
        num_workers=run.num_workers,
        sawtooth=saw,
        stalls=stalls,
        cores=cores or usable_cores(),
    )
    return WatchSummary(
        steps=run.steps,
        samples=samples,
        elapsed_s=elapsed,
        wait_s=total_wait,
        compute_s=total_compute,
        wait_fraction=frac,
        samples_per_s=samples / elapsed if samples is not None and elapsed > 0 else None,
        median_wait_s=percentile(wait, 50),
        p95_wait_s=percentile(wait, 95),
        max_wait_s=max(wait),
        median_compute_s=percentile(compute, 50),
        verdict=verdict,
        diagnosis=text,
        action=action,
        stalls=stalls,
        sawtooth=saw,
    )
