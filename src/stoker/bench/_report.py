"""Reporting a bench result: the terminal tables and one verdict per workload.

The JSON document is written and read by :mod:`stoker.bench._json`.
"""

from __future__ import annotations

from typing import Any

from stoker.bench._result import BenchResult, WorkloadResult
from stoker.bench._roles import ROLE_TEXT, ROLES_EXPLAINED
from stoker.bench._train_result import TrainTable
from stoker.bench._verdict import verdict

__all__ = ["render", "verdict"]

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
_TRAIN_COLUMNS = (
    "contender",
    "role",
    "steps/s",
    "±",
    "x torch best",
    "data wait",
    "step ms",
    "step slowdown",
)


def _role_text(roles: tuple[str, ...]) -> str:
    return ", ".join(t for t in (ROLE_TEXT.get(r, r) for r in roles) if t)  # type: ignore[call-overload]


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _new_table(title: str, columns: tuple[str, ...]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for header in columns:
        left = header in ("contender", "role")
        table.add_column(header, justify="left" if left else "right", no_wrap=True)
    return table


def _table(w: WorkloadResult) -> Any:
    table = _new_table(
        f"[bold]{w.name}[/], loader only: {w.description}"
        f" [dim](batch {w.batch_size}, {w.duration_s:.0f} s)[/]",
        _COLUMNS,
    )
    if w.mode == "epochs":
        table.columns[-1].header = "1st batch ms/epoch"
    fastest = w.torch_best
    for c in w.contenders:
        role = _role_text(c.roles)
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


def _train_table(w: WorkloadResult, t: TrainTable) -> Any:
    table = _new_table(f"[bold]{w.name}[/], train {t.shape}: {t.description}", _TRAIN_COLUMNS)
    mem = t.memory_steps_per_s
    table.add_row(
        "[dim]fed from memory[/]",
        "[dim]the step alone[/]",
        _fmt(mem, ".1f"),
        "",
        "",
        "0%" if mem is not None else "-",
        _fmt(t.memory_step_ms, ".1f"),
        "1.00x" if mem is not None else "-",
    )
    fastest = t.best("torch")
    for c in t.contenders:
        name = f"[bold]{c.name}[/]" if c.library == "stoker" else c.name
        if c is fastest:
            name += " [bold]*[/]"
        if not c.ok:
            table.add_row(name, _role_text(c.roles), f"[red]failed: {c.error}[/]")
            continue
        table.add_row(
            name,
            _role_text(c.roles),
            _fmt(c.steps_per_s, ".1f"),
            _fmt(c.spread, ".0%"),
            _times(t.ratio_to_best(c)),
            _fmt(c.wait_share, ".0%"),
            _fmt(c.step_ms, ".1f"),
            _times(t.slowdown(c)),
        )
    return table


def _workload(out: Any, w: WorkloadResult) -> None:
    out.print()
    if w.error:
        out.print(f"[bold]{w.name}[/]: [yellow]not run: {w.error}[/]")
        return
    for t in w.train:
        out.print(_train_table(w, t))
    out.print(_table(w))
    out.print(f"  [bold]verdict:[/] {verdict(w)}", highlight=False)
    if w.ideal is not None:
        kind = "ideal" if w.ideal.is_limit else "reference (not a limit here, no % ideal)"
        out.print(f"  {kind} {w.ideal.samples_per_s:,.0f} samples/s = {w.ideal.note}", style="dim")
    for note in w.notes:
        out.print(f"  {note}", style="dim", highlight=False)


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
        _workload(out, w)
    out.print()
    out.print(
        f"{ROLES_EXPLAINED} train tables: training steps/s with each loader feeding the step "
        "(x torch best: over the torch row with the most steps/s); data wait: share of the "
        "run spent waiting for a batch; step ms: time inside the step; step slowdown: step ms "
        "over the same step fed from memory (the loader's cost to the step itself). "
        "Loader-only tables: * = torch's best, the torch row with the highest median here. "
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
