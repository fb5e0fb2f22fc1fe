"""The ``stoker`` command.

Each subcommand lives in its own module, which exposes two functions:

``configure(parser: argparse.ArgumentParser) -> None``
    adds the subcommand's arguments (keep imports here light: ``stoker --help`` imports every
    subcommand module);
``run(args: argparse.Namespace) -> int``
    does the work and returns the process exit status (heavy imports go here).

To add a subcommand, add one row to ``_COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# name -> (module, one-line help). Kept in the order `stoker --help` shows them.
_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": (
        "stoker.bench._cli",
        "torch's DataLoader and stoker side by side on built-in workloads",
    ),
    "tune": ("stoker._tune_cli", "search a fast loader configuration and write stoker.toml"),
    "report": (
        "stoker.monitor._report_cli",
        "summary and timeline plot of a stoker.watch jsonl log",
    ),
    "doctor": ("stoker.doctor._cli", "find what slows or breaks data loading, and how to fix it"),
    "env": ("stoker.doctor._env_cli", "what this machine offers for data loading; export it"),
    "pack": (
        "stoker.shards._pack_cli",
        "a dataset into indexed tar shards (WebDataset-compatible)",
    ),
    "index": ("stoker.shards._index_cli", "build index.json for tar shards written by other tools"),
}


def _build_parser() -> argparse.ArgumentParser:
    from stoker import __version__

    parser = argparse.ArgumentParser(
        prog="stoker",
        description="Keep PyTorch training fed: measure, diagnose and fix data loading.",
    )
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in _COMMANDS.items():
        module = importlib.import_module(module_name)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(sub_parser)
        sub_parser.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console script; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except KeyboardInterrupt:
        print("stoker: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
