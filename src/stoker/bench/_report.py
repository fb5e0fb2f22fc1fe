"""Reporting a bench result: the terminal table, one verdict per workload, and JSON.

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
                  "error": null}, ...],      # torch's grid search (short runs)
        "notes": ["..."],
        "verdict": "stoker 2.30x faster than torch's best here; ...",
        "torch_best": "torch nw=0",
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

from stoker.bench._result import (
    BenchResult,
    ContenderResult,
    GridPoint,
    Ramp,
    RunSample,
    WorkloadResult,
)
from stoker.bench._roles import ROLE_TEXT, ROLES_EXPLAINED
from stoker.bench._stats import Ideal, ratio
from stoker.errors import ConfigError

__all__ = ["SCHEMA", "from_json", "read_json", "render", "to_json", "verdict", "write_json"]

SCHEMA = "stoker.bench/1"
# Ratios closer than this to 1.0 read "on par".
PAR_BAND = 0.03
BEST_TEXT = "torch's best here"
# The verdict mentions memory when stoker's PSS differs from torch's by more than this.
PSS_NOTE_BAND = 0.2
_COLUMNS = (
    "contender",
    "role",
    "samples/s",
    "±",
    "x best",
    "x same",
    "% ideal",
    "main ms/batch",
    "CPU s/1k",
    "PSS MiB",
    "1st batch ms",
)
# Width of the table when the output is not a terminal.
PLAIN_WIDTH = 150


def _speed(r: float, what: str) -> str:
    if abs(r - 1) < PAR_BAND:
        return f"on par with {what} ({r:.2f}x)"
    if r >= 1:
        return f"{r:.2f}x faster than {what}"
    return f"{1 / r:.2f}x slower than {what}"


def _ramp_text(r: Ramp) -> str:
    start = f"from {r.start_workers}"
    if r.error:
        return f"{start} failed"
    if r.reach_s is None:
        return f"{start}: not within {r.seconds:.0f} s"
    share = r.share_of_epoch
    of_epoch = f", {share:.1%} of an epoch" if share is not None else ""
    return f"{start}: {r.reach_s:.1f} s{of_epoch} (-> {r.final_workers} {r.backend})"


def verdict(w: WorkloadResult) -> str:
    """One line saying how stoker did on workload ``w``."""
    if w.error:
        return f"not run: {w.error}"
    st = next((c for c in w.contenders if "stoker" in c.roles), None)
    if st is None:
        return "no stoker contender"
    if not st.ok:
        return f"stoker failed: {st.error}"
    parts = []
    best, same = w.torch_best, w.torch_same
    r = w.ratio_to_best(st)
    if r is not None and best is not None:
        parts.append(f"stoker {_speed(r, BEST_TEXT)} ({best.name})")
    r_same = w.ratio_to_same(st)
    if r_same is not None and same is not None and same is not best:
        nw = same.config.get("num_workers")
        parts.append(f"{r_same:.2f}x torch at the same {nw} workers")
    frac = w.fraction_of_ideal(st)
    if frac is not None:
        parts.append(f"{frac:.0%} of this machine's limit")
    auto = next((c for c in w.contenders if "stoker-auto" in c.roles and c.ok), None)
    r_auto = w.ratio_to_best(auto) if auto is not None else None
    if r_auto is not None:
        parts.append(f'num_workers="auto" {r_auto:.2f}x torch\'s best')
    ramps = [_ramp_text(r) for r in w.ramps]
    if ramps:
        parts.append("auto ramp " + ", ".join(ramps))
    watched = next((c for c in w.contenders if "stoker-watched" in c.roles and c.ok), None)
    if watched is not None and watched.samples_per_s and st.samples_per_s:
        ab = 1 - watched.samples_per_s / st.samples_per_s
        own = watched.monitor_overhead
        spreads = [x for x in (watched.spread, st.spread) if x is not None]
        noise = f" within a spread of {max(spreads):.0%}" if spreads else ""
        text = f"stoker.watch costs {ab:.1%} (A/B{noise})"
        if own is not None:
            text += f", {own:.2%} of wall time by its own clock"
        parts.append(text)
    mine, theirs = st.peak_pss_bytes, same.peak_pss_bytes if same else None
    pss_ratio = ratio(mine, theirs)
    if mine is not None and theirs is not None and pss_ratio is not None:
        if abs(pss_ratio - 1) > PSS_NOTE_BAND:
            parts.append(
                f"PSS {mine / 2**20:,.0f} MiB vs {theirs / 2**20:,.0f} MiB for torch at the "
                "same workers"
            )
    if w.mode == "epochs" and st.epoch_first_batch_s:
        fresh = next(
            (
                c
                for c in w.contenders
                if c.ok and c.library == "torch" and c.config.get("persistent_workers") is False
            ),
            None,
        )
        last = len(st.epoch_first_batch_s) - 1
        text = f"epoch {last + 1} first batch {1000 * st.epoch_first_batch_s[last]:.0f} ms"
        if fresh is not None and len(fresh.epoch_first_batch_s) > last:
            text += f" vs {1000 * fresh.epoch_first_batch_s[last]:.0f} ms ({fresh.name})"
        parts.append(text)
    return "; ".join(parts) if parts else "no comparison possible (torch did not run)"


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _table(w: WorkloadResult) -> Any:
    from rich.table import Table

    table = Table(
        title=f"[bold]{w.name}[/]: {w.description} [dim]({w.duration_s:.0f} s)[/]",
        title_justify="left",
        header_style="bold",
    )
    for header in _COLUMNS:
        left = header in ("contender", "role")
        table.add_column(header, justify="left" if left else "right", no_wrap=True)
    if w.mode == "epochs":
        table.columns[-1].header = "1st batch ms/epoch"
    fastest = w.torch_best
    for c in w.contenders:
        role = ", ".join(t for t in (ROLE_TEXT.get(r, r) for r in c.roles) if t)
        name = f"[bold]{c.name}[/]" if c.library == "stoker" else c.name
        if c is fastest:
            name += " [bold]*[/]"
        if not c.ok:
            table.add_row(name, role, f"[red]failed: {c.error}[/]")
            continue
        if c.epoch_first_batch_s:
            first = " / ".join(f"{1000 * x:.0f}" for x in c.epoch_first_batch_s)
        else:
            first = _fmt(c.first_batch_s, ".1f", 1000)
        table.add_row(
            name,
            role,
            _fmt(c.samples_per_s, ",.0f"),
            _fmt(c.spread, ".0%"),
            _times(w.ratio_to_best(c)),
            _times(w.ratio_to_same(c)),
            _fmt(w.fraction_of_ideal(c), ".0%"),
            _fmt(c.main_cpu_ms_per_batch, ".2f"),
            _fmt(c.cpu_s_per_1k_samples, ".3f"),
            _fmt(c.peak_pss_bytes, ",.0f", 1 / 2**20),
            first,
        )
    return table


def render(result: BenchResult, console: Any = None) -> None:
    """Print one table per workload, its verdict and notes, then a summary.

    Args:
        result: what to print.
        console: a ``rich.console.Console``. Default: a new one on stdout.
    """
    from rich.console import Console

    out = console or Console()
    m = result.machine
    out.print(
        f"[bold]stoker bench[/] ({'quick' if result.quick else 'full'}, "
        f"{result.repeats} repeats, medians): {m.get('usable_cores')} usable cores, "
        f"{m.get('cpu') or 'unknown CPU'}, torch {m.get('torch')}, "
        f"start method {m.get('start_method')}"
    )
    for w in result.workloads:
        out.print()
        if w.error:
            out.print(f"[bold]{w.name}[/]: [yellow]not run: {w.error}[/]")
            continue
        out.print(_table(w))
        out.print(f"  [bold]verdict:[/] {verdict(w)}", highlight=False)
        if w.ideal is not None:
            kind = "ideal" if w.ideal.is_limit else "reference (not a limit here, no % ideal)"
            out.print(
                f"  {kind} {w.ideal.samples_per_s:,.0f} samples/s = {w.ideal.note}", style="dim"
            )
        for note in w.notes:
            out.print(f"  {note}", style="dim", highlight=False)
    out.print()
    out.print(
        f"{ROLES_EXPLAINED} * = torch's best: the torch row with the highest median here. "
        "x best / x same: samples/s relative to torch's best and to same nw; % ideal: of "
        "this machine's limit (every usable core doing the work torch's loader does per "
        "sample), where it is one; main ms/batch: CPU of the main process per batch; "
        "CPU s/1k: CPU seconds of main + workers per 1,000 samples.",
        style="dim",
    )
    fill = m.get("fill_s")
    timed = (
        f"each timed run starts an epoch and is timed after its first {fill:g} s, while the "
        "pipeline fills (1st batch ms is from iter()); "
        if isinstance(fill, (int, float)) and fill > 0
        else ""
    )
    out.print(
        f"± is half the range of the repeats; {timed}torch configurations with workers use "
        "persistent_workers=True unless marked fresh; PSS is main process + workers (peak).",
        style="dim",
    )
    out.print(f"[bold]total time[/]: {result.duration_s:.0f} s")
    for w in result.workloads:
        out.print(f"  [bold]{w.name}[/]: {verdict(w)}", highlight=False)


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


def to_json(result: BenchResult) -> dict[str, Any]:
    """The result as a JSON-ready dict (schema ``stoker.bench/1``, see the module docstring)."""
    workloads = []
    for w in result.workloads:
        ideal = None
        if w.ideal is not None:
            ideal = {
                "cores": w.ideal.cores,
                "cpu_s_per_sample": w.ideal.cpu_s_per_sample,
                "wall_s_per_sample": w.ideal.wall_s_per_sample,
                "samples": w.ideal.samples,
                "note": w.ideal.note,
                "is_limit": w.ideal.is_limit,
                "samples_per_s": w.ideal.samples_per_s,
            }
        best = w.torch_best
        workloads.append(
            {
                "name": w.name,
                "description": w.description,
                "batch_size": w.batch_size,
                "mode": w.mode,
                "error": w.error,
                "duration_s": w.duration_s,
                "ideal": ideal,
                "grid": [vars(p).copy() for p in w.grid],
                "notes": list(w.notes),
                "verdict": verdict(w),
                "torch_best": best.name if best else None,
                "ramps": [
                    {**vars(r), "decisions": list(r.decisions), "share_of_epoch": r.share_of_epoch}
                    for r in w.ramps
                ],
                "contenders": [
                    {
                        "name": c.name,
                        "library": c.library,
                        "roles": list(c.roles),
                        "config": dict(c.config),
                        "error": c.error,
                        "summary": _summary(w, c),
                        "runs": [
                            {**vars(r), "epoch_first_batch_s": list(r.epoch_first_batch_s)}
                            for r in c.runs
                        ],
                    }
                    for c in w.contenders
                ],
            }
        )
    return {
        "schema": SCHEMA,
        "started_at": result.started_at,
        "duration_s": result.duration_s,
        "quick": result.quick,
        "repeats": result.repeats,
        "machine": dict(result.machine),
        "workloads": workloads,
    }


def from_json(data: dict[str, Any]) -> BenchResult:
    """Rebuild a :class:`BenchResult` from :func:`to_json`'s output.

    Raises:
        ConfigError: if ``data`` is not a ``stoker.bench/1`` document.
    """
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"not a {SCHEMA} document: `schema` is {found!r}.")
    try:
        workloads = []
        for w in data["workloads"]:
            ideal = None
            if w["ideal"] is not None:
                fields = ("cores", "cpu_s_per_sample", "wall_s_per_sample", "samples", "note")
                # `is_limit` is absent from documents written before it existed: a limit.
                ideal = Ideal(
                    **{k: w["ideal"][k] for k in fields},
                    is_limit=bool(w["ideal"].get("is_limit", True)),
                )
            contenders = tuple(
                ContenderResult(
                    name=c["name"],
                    library=c["library"],
                    roles=tuple(c["roles"]),
                    config=dict(c["config"]),
                    error=c["error"],
                    runs=tuple(
                        RunSample(
                            **{**r, "epoch_first_batch_s": tuple(r.get("epoch_first_batch_s", ()))}
                        )
                        for r in c["runs"]
                    ),
                )
                for c in w["contenders"]
            )
            workloads.append(
                WorkloadResult(
                    name=w["name"],
                    description=w["description"],
                    batch_size=w["batch_size"],
                    mode=w["mode"],
                    ideal=ideal,
                    contenders=contenders,
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
                )
            )
        return BenchResult(
            workloads=tuple(workloads),
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
