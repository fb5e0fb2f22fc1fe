"""``stoker tune module:factory -b BATCH``: search a fast configuration, write stoker.toml.

:func:`run` imports what it uses (torch, rich, the tuner) when it runs, so that ``stoker
--help`` and the other commands start without them.
"""

from __future__ import annotations

import argparse

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``stoker tune``'s arguments to ``parser``."""
    parser.add_argument(
        "factory",
        help="`module:factory`: FACTORY() returns a map-style Dataset. MODULE is imported, "
        "which runs its top-level code, with the current directory on sys.path while it "
        "imports (and off it afterwards)",
    )
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
    """Search, print the rounds and write the configuration; returns the exit status.

    Raises:
        ConfigError: a usage error (reported by :func:`stoker.cli.main`, status 2).
    """
    from rich.table import Table
    from rich.text import Text

    from stoker._commands.console import console
    from stoker._commands.output import check_output_path
    from stoker._commands.target import call_factory, import_factory
    from stoker.tuner._tune import tune

    out = console()
    check_output_path(args.output, "--output")
    dataset = call_factory(import_factory(args.factory, "factory"), args.factory)
    result = tune(
        dataset,
        args.batch_size,
        budget_s=args.budget,
        device=args.device,
        output=args.output,
        report=lambda msg: out.print(f"  {msg}", markup=False, highlight=False),
    )
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
    out.print(table)
    out.print(
        Text.assemble(
            "best: ",
            (result.best.label, "bold"),
            f", {result.speedup:.2f}x torch's DataLoader defaults ({result.best_rate:,.0f} vs "
            f"{result.baseline_rate:,.0f} samples/s); written to {result.config_path}. Use it: "
            f"`stoker.DataLoader(dataset, batch_size={args.batch_size}, "
            f'config="{result.config_path}")`.',
        )
    )
    return 0
