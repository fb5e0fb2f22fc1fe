"""A bench result as JSON, and back.

JSON schema ``stoker.bench/1`` (``stoker bench --json out.json``)::

    {
      "schema": "stoker.bench/1",
      "started_at": "2026-11-22T12:00:00+00:00",  "duration_s": 97.1,
      "quick": true,  "repeats": 3,
      "machine": {"usable_cores": 2, "cpu_count": 2, "cpu": "...", "platform": "...",
                  "python": "3.11.2", "torch": "2.13.0", "stoker": "0.1.0", "cuda": false,
                  "start_method": "fork"},
      "workloads": [{
        "name": "tiny", "description": "...", "batch_size": 256, "mode": "steady",
        "error": null,                       # why the workload could not run, if it could not
        "duration_s": 24.5,                  # wall seconds this workload took
        "ideal": {"cores": 2, "cpu_s_per_sample": 2.6e-06, "wall_s_per_sample": 2.7e-06,
                  "samples": 113408, "note": "...", "is_limit": true,
                  "samples_per_s": 763947.0},      # is_limit false: a reference, no %
        "grid": [{"num_workers": 0, "prefetch_factor": null, "samples_per_s": 345015.2,
                  "error": null, "library": "torch"}, ...],   # each library's grid (short runs)
        "notes": ["..."],
        "verdict": "stoker 2.30x faster than torch's best here; ...",
        "torch_best": "torch nw=0",
        "train": [{"shape": "gpu", "description": "...",       # the train family's tables
                   "memory": [{"seconds": ..., "steps": ..., "wait_s": ..., "step_s": ...}],
                   "contenders": [{"name": ..., "library": ..., "roles": [...],
                                   "config": {...}, "error": null,
                                   "runs": [{"seconds": ..., "steps": ..., "wait_s": ...,
                                             "step_s": ..., "ended": "process:8"}, ...]},
                                  ...]}, ...],   # ended: a stoker loader's end state
        "ramps": [{"start_workers": 1, "seconds": 10.0, "reference_samples_per_s": ...,
                   "reach_s": 1.2, "epoch_s": 48.1, "share_of_epoch": 0.025,
                   "final_workers": 24, "backend": "thread", "decisions": ["..."],
                   "error": null}, ...],         # num_workers="auto" ramp runs (full mode)
        "contenders": [{
          "name": "torch nw=0", "library": "torch", "roles": ["torch-nw0", "torch-best"],
          "config": {"num_workers": 0, "prefetch_factor": null,
                     "persistent_workers": null, "pin_memory": false},
          "error": null,
          "summary": {"samples_per_s": ..., "spread": ..., "ratio_to_torch_best": ...,
                      "ratio_to_torch_same": ..., "fraction_of_ideal": ...,
                      "main_cpu_ms_per_batch": ..., "cpu_s_per_1k_samples": ...,
                      "peak_pss_bytes": ..., "first_batch_s": ...,
                      "epoch_first_batch_s": [...], "monitor_overhead": ...},
          "runs": [{"seconds": ..., "samples": ..., "batches": ..., "first_batch_s": ...,
                    "main_cpu_s": ..., "tree_cpu_s": ..., "peak_pss_bytes": ...,
                    "epoch_first_batch_s": [...], "monitor_overhead_s": ...}, ...]
        }, ...]
      }, ...]
    }

``summary``, ``verdict``, ``torch_best`` and ``ideal.samples_per_s`` are derived (medians over
``runs``); they are written for convenience and recomputed, not read, by :func:`from_json`.
A reader must reject a ``schema`` it does not know; fields may be added within version 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stoker.bench._report import verdict
from stoker.bench._result import (
    BenchResult,
    ContenderResult,
    GridPoint,
    Ramp,
    RunSample,
    WorkloadResult,
)
from stoker.bench._stats import Ideal
from stoker.bench._train_result import TrainContender, TrainSample, TrainTable
from stoker.errors import ConfigError

__all__ = ["SCHEMA", "from_json", "read_json", "to_json", "write_json"]

SCHEMA = "stoker.bench/1"


def _summary(w: WorkloadResult, c: ContenderResult) -> dict[str, Any]:
    return {
        "samples_per_s": c.samples_per_s,
        "spread": c.spread,
        "ratio_to_torch_best": w.ratio_to_best(c),
        "ratio_to_torch_same": w.ratio_to_same(c),
        "fraction_of_ideal": w.fraction_of_ideal(c),
        "main_cpu_ms_per_batch": c.main_cpu_ms_per_batch,
        "cpu_s_per_1k_samples": c.cpu_s_per_1k_samples,
        "peak_pss_bytes": c.peak_pss_bytes,
        "first_batch_s": c.first_batch_s,
        "epoch_first_batch_s": list(c.epoch_first_batch_s),
        "monitor_overhead": c.monitor_overhead,
    }


def _ideal_json(ideal: Ideal | None) -> dict[str, Any] | None:
    if ideal is None:
        return None
    return {
        "cores": ideal.cores,
        "cpu_s_per_sample": ideal.cpu_s_per_sample,
        "wall_s_per_sample": ideal.wall_s_per_sample,
        "samples": ideal.samples,
        "note": ideal.note,
        "is_limit": ideal.is_limit,
        "samples_per_s": ideal.samples_per_s,
    }


def _head(c: ContenderResult | TrainContender) -> dict[str, Any]:
    """What names a contender, in either family."""
    return {
        "name": c.name,
        "library": c.library,
        "roles": list(c.roles),
        "config": dict(c.config),
        "error": c.error,
    }


def _train_json(t: TrainTable) -> dict[str, Any]:
    return {
        "shape": t.shape,
        "description": t.description,
        "memory": [vars(r).copy() for r in t.memory],
        "contenders": [
            {**_head(c), "runs": [vars(r).copy() for r in c.runs]} for c in t.contenders
        ],
    }


def _workload_json(w: WorkloadResult) -> dict[str, Any]:
    best = w.torch_best
    return {
        "name": w.name,
        "description": w.description,
        "batch_size": w.batch_size,
        "mode": w.mode,
        "error": w.error,
        "duration_s": w.duration_s,
        "ideal": _ideal_json(w.ideal),
        "grid": [vars(p).copy() for p in w.grid],
        "notes": list(w.notes),
        "verdict": verdict(w),
        "torch_best": best.name if best else None,
        "train": [_train_json(t) for t in w.train],
        "ramps": [
            {**vars(r), "decisions": list(r.decisions), "share_of_epoch": r.share_of_epoch}
            for r in w.ramps
        ],
        "contenders": [
            {
                **_head(c),
                "summary": _summary(w, c),
                "runs": [
                    {**vars(r), "epoch_first_batch_s": list(r.epoch_first_batch_s)} for r in c.runs
                ],
            }
            for c in w.contenders
        ],
    }


def to_json(result: BenchResult) -> dict[str, Any]:
    """The result as a JSON-ready dict (schema ``stoker.bench/1``, see the module docstring)."""
    return {
        "schema": SCHEMA,
        "started_at": result.started_at,
        "duration_s": result.duration_s,
        "quick": result.quick,
        "repeats": result.repeats,
        "machine": dict(result.machine),
        "workloads": [_workload_json(w) for w in result.workloads],
    }


def _train_from(t: dict[str, Any]) -> TrainTable:
    return TrainTable(
        shape=t["shape"],
        description=t["description"],
        memory=tuple(TrainSample(**r) for r in t["memory"]),
        contenders=tuple(
            TrainContender(
                name=c["name"],
                library=c["library"],
                roles=tuple(c["roles"]),
                config=dict(c["config"]),
                error=c["error"],
                runs=tuple(TrainSample(**r) for r in c["runs"]),
            )
            for c in t["contenders"]
        ),
    )


def _contender_from(c: dict[str, Any]) -> ContenderResult:
    return ContenderResult(
        name=c["name"],
        library=c["library"],
        roles=tuple(c["roles"]),
        config=dict(c["config"]),
        error=c["error"],
        runs=tuple(
            RunSample(**{**r, "epoch_first_batch_s": tuple(r.get("epoch_first_batch_s", ()))})
            for r in c["runs"]
        ),
    )


def _workload_from(w: dict[str, Any]) -> WorkloadResult:
    ideal = None
    if w["ideal"] is not None:
        fields = ("cores", "cpu_s_per_sample", "wall_s_per_sample", "samples", "note")
        # `is_limit` is absent from documents written before it existed: a limit.
        ideal = Ideal(
            **{k: w["ideal"][k] for k in fields}, is_limit=bool(w["ideal"].get("is_limit", True))
        )
    return WorkloadResult(
        name=w["name"],
        description=w["description"],
        batch_size=w["batch_size"],
        mode=w["mode"],
        ideal=ideal,
        contenders=tuple(_contender_from(c) for c in w["contenders"]),
        grid=tuple(GridPoint(**p) for p in w["grid"]),
        notes=tuple(w["notes"]),
        error=w["error"],
        duration_s=w.get("duration_s", 0.0),
        ramps=tuple(
            Ramp(
                **{
                    **{k: v for k, v in r.items() if k != "share_of_epoch"},
                    "decisions": tuple(r.get("decisions", ())),
                }
            )
            for r in w.get("ramps", ())
        ),
        # Absent from documents written before the train family existed.
        train=tuple(_train_from(t) for t in w.get("train", ())),
    )


def from_json(data: dict[str, Any]) -> BenchResult:
    """Rebuild a :class:`BenchResult` from :func:`to_json`'s output.

    Raises:
        ConfigError: if ``data`` is not a ``stoker.bench/1`` document.
    """
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"not a {SCHEMA} document: `schema` is {found!r}.")
    try:
        return BenchResult(
            workloads=tuple(_workload_from(w) for w in data["workloads"]),
            quick=data["quick"],
            repeats=data["repeats"],
            machine=dict(data["machine"]),
            started_at=data["started_at"],
            duration_s=data["duration_s"],
        )
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"malformed {SCHEMA} document: {type(exc).__name__}: {exc}.") from exc


def write_json(result: BenchResult, path: str | Path) -> None:
    """Write ``result`` to ``path`` as indented JSON."""
    Path(path).write_text(json.dumps(to_json(result), indent=2) + "\n")


def read_json(path: str | Path) -> BenchResult:
    """Read a result written by :func:`write_json`.

    Raises:
        ConfigError: if the file is not a ``stoker.bench/1`` document.
    """
    return from_json(json.loads(Path(path).read_text()))
