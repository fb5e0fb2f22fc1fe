"""``stoker report run.jsonl [-o timeline.png] [--json]``: read a ``stoker.watch`` log."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from stoker._commands.text import printable

if TYPE_CHECKING:
    from rich.table import Table

    from stoker.monitor._types import WatchSummary

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


def _table(summary: WatchSummary, path: str) -> Table:
    """The summary as a two-column table. Every cell is a :class:`rich.text.Text`, never
    markup: the path and the log's contents are untrusted text."""
    from rich.table import Table
    from rich.text import Text

    from stoker.monitor._display import VERDICT_STYLE
    from stoker.monitor._figures import ms

    s = summary
    # The path whole, control characters escaped (a log named to clear the screen).
    title = Text(f"stoker report: {printable(path)}", no_wrap=True, overflow="ignore")
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value")
    style = VERDICT_STYLE[s.verdict]

    def row(metric: str, *value: str | tuple[str, str]) -> None:
        table.add_row(metric, Text.assemble(*value))

    row("verdict", (s.verdict, style), f" ({s.evidence})")
    row("steps", f"{s.steps:,} ({s.steady_steps:,} in steady state)")
    if s.samples is not None:
        row("samples", f"{s.samples:,}")
    row("wall time", f"{s.elapsed_s:,.2f} s")
    row("start-up", f"{ms(s.startup_s)} (iter() to the first batch, summed over passes)")
    if s.samples_per_s is not None:
        row("throughput", f"{s.samples_per_s:,.0f} samples/s")
    else:
        row("throughput", f"{s.steps / max(s.elapsed_s, 1e-9):,.1f} steps/s")
    row("data wait", (f"{s.wait_fraction:.1%}", style), " of steady-state step time")
    row(
        "wait per step",
        f"median {_ms(s.median_wait_s)}, p95 {_ms(s.p95_wait_s)}, max {_ms(s.max_wait_s)}",
    )
    row("compute per step", f"median {_ms(s.median_compute_s)}")
    if s.stalls:
        worst = max(s.stalls, key=lambda e: e.wait_s)
        row("stalls", f"{len(s.stalls)} (worst {worst.wait_s:.2f} s at step {worst.step})")
    else:
        row("stalls", "none")
    if s.sawtooth is not None:
        row(
            "sawtooth",
            f"wait spikes every {s.sawtooth.period} steps "
            f"({_ms(s.sawtooth.spike_wait_s)} vs {_ms(s.sawtooth.base_wait_s)}; "
            f"{s.sawtooth.cost_fraction:.0%} of step time)",
        )
    else:
        row("sawtooth", "none")
    row("diagnosis", s.diagnosis)
    if s.action:
        row("action", s.action)
    return table


def run(args: argparse.Namespace) -> int:
    """Print the summary of ``args.log`` and draw the timeline when ``-o`` is given.

    Raises:
        ConfigError: the log cannot be read or is not a ``stoker.watch`` log, or ``-o`` cannot
            be written (a usage error, status 2).
    """
    from stoker._commands.console import console
    from stoker._commands.output import check_output_path
    from stoker.monitor._report import load_run, summarize
    from stoker.monitor._sinks import to_json

    if args.output:
        check_output_path(args.output, "--output")
    log = load_run(args.log)
    summary = summarize(log)
    if args.json:
        print(json.dumps(to_json(summary), indent=2))
    else:
        console().print(_table(summary, args.log))
    if args.output:
        from stoker.monitor._timeline import plot_timeline

        try:
            plot_timeline(log, summary, args.output)
        except (OSError, ValueError) as exc:
            print(f"stoker report: cannot write {args.output!r}: {exc}", file=sys.stderr)
            return 1
        print(f"timeline written to {args.output}", file=sys.stderr if args.json else sys.stdout)
    return 0
