"""``stoker tune module:factory -b BATCH``: search a fast configuration, write stoker.toml."""

from __future__ import annotations

import argparse

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("factory", help="`module:factory` returning a map-style Dataset")
    parser.add_argument("-b", "--batch-size", type=int, required=True, help="samples per batch")
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="time the search may take (default 60)",
    )
    parser.add_argument("--device", default=None, help="'cuda' also tries pinned memory")
    parser.add_argument(
        "-o", "--output", default="stoker.toml", help="file to write (default stoker.toml)"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from stoker._output import check_output_path
    from stoker._tune import tune
    from stoker.bench._cli import load_factory
    from stoker.errors import ConfigError

    console = Console()
    try:
        check_output_path(args.output, "--output")
        factory = load_factory(args.factory)
        result = tune(
            factory,
            args.batch_size,
            budget_s=args.budget,
            device=args.device,
            output=args.output,
            report=lambda msg: console.print(f"  {msg}", highlight=False),
        )
    except ConfigError as exc:
        console.print(f"[red]stoker tune:[/red] {exc}")
        return 2
    table = Table(title=f"stoker tune: {len(result.rounds)} rounds in {result.seconds:.0f} s")
    table.add_column("configuration")
    table.add_column("samples/s", justify="right")
    table.add_column("round", justify="right")
    shown: set[object] = set()
    for r, (secs, scored) in reversed(list(enumerate(result.rounds))):
        for cand, rate in scored:
            if cand not in shown:
                shown.add(cand)
                table.add_row(cand.label, f"{rate:,.0f}", f"{r + 1} ({secs:.1f}s)")
    console.print(table)
    console.print(
        f"best: [bold]{result.best.label}[/bold], {result.speedup:.2f}x torch's DataLoader "
        f"defaults ({result.best_rate:,.0f} vs {result.baseline_rate:,.0f} samples/s); "
        f"written to {result.config_path}. Use it: "
        f"`stoker.DataLoader(dataset, batch_size={args.batch_size}, "
        f'config="{result.config_path}")`.',
        highlight=False,
    )
    return 0
