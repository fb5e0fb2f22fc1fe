"""``stoker report run.jsonl [-o timeline.png] [--json]``: read a ``stoker.watch`` log."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``report`` arguments (light imports only)."""
    parser.add_argument("log", help="jsonl file written by stoker.watch(..., log=PATH)")
    parser.add_argument(
        "-o", "--output", metavar="IMAGE", help="write the timeline plot here (e.g. run.png)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the summary as JSON instead of a table"
    )


def _ms(x: float) -> str:
    return f"{x * 1e3:,.2f} ms"


def _table(summary: object, path: str) -> object:
    from rich.table import Table

    from stoker.monitor._types import WatchSummary

    assert isinstance(summary, WatchSummary)
    s = summary
    table = Table(title=f"stoker report: {path}", show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value")
    style = {"healthy": "green", "mild": "yellow", "starved": "bold red"}[s.verdict]
    table.add_row("verdict", f"[{style}]{s.verdict}[/]")
    table.add_row("steps", f"{s.steps:,}")
    if s.samples is not None:
        table.add_row("samples", f"{s.samples:,}")
    table.add_row("wall time", f"{s.elapsed_s:,.2f} s")
    if s.samples_per_s is not None:
        table.add_row("throughput", f"{s.samples_per_s:,.1f} samples/s")
    else:
        table.add_row("throughput", f"{s.steps / max(s.elapsed_s, 1e-9):,.2f} steps/s")
    table.add_row("data wait", f"[{style}]{s.wait_fraction:.1%}[/] of step time")
    table.add_row(
        "wait per step",
        f"median {_ms(s.median_wait_s)}, p95 {_ms(s.p95_wait_s)}, max {_ms(s.max_wait_s)}",
    )
    table.add_row("compute per step", f"median {_ms(s.median_compute_s)}")
    if s.stalls:
        worst = max(s.stalls, key=lambda e: e.wait_s)
        table.add_row(
            "stalls", f"{len(s.stalls)} (worst {worst.wait_s:.2f} s at step {worst.step})"
        )
    else:
        table.add_row("stalls", "none")
    if s.sawtooth is not None:
        table.add_row(
            "sawtooth",
            f"wait spikes every {s.sawtooth.period} steps "
            f"({_ms(s.sawtooth.spike_wait_s)} vs {_ms(s.sawtooth.base_wait_s)}; "
            f"{s.sawtooth.cost_fraction:.0%} of step time)",
        )
    else:
        table.add_row("sawtooth", "none")
    table.add_row("diagnosis", s.diagnosis)
    if s.action:
        table.add_row("action", s.action)
    return table


def run(args: argparse.Namespace) -> int:
    """Print the summary of ``args.log`` and draw the timeline when ``-o`` is given."""
    from rich.console import Console

    from stoker.errors import ConfigError
    from stoker.monitor._report import load_run, summarize
    from stoker.monitor._sinks import to_json

    err = Console(stderr=True)
    try:
        log = load_run(args.log)
    except ConfigError as exc:
        err.print(f"stoker report: {exc}", markup=False, highlight=False)
        return 2
    summary = summarize(log)
    if args.json:
        print(json.dumps(to_json(summary), indent=2))
    else:
        Console().print(_table(summary, args.log))
    if args.output:
        from stoker.monitor._timeline import plot_timeline

        try:
            plot_timeline(log, summary, args.output)
        except (OSError, ValueError) as exc:
            err.print(f"stoker report: cannot write {args.output!r}: {exc}", markup=False)
            return 2
        print(f"timeline written to {args.output}", file=sys.stderr if args.json else sys.stdout)
    return 0
