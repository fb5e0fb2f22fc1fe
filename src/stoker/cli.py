"""The ``stoker`` command.

Each subcommand lives in its own module, which exposes two functions:

``configure(parser: argparse.ArgumentParser) -> None``
    adds the subcommand's arguments (keep imports here light: ``stoker --help`` imports every
    subcommand module);
``run(args: argparse.Namespace) -> int``
    does the work and returns the process exit status, 0 or 1 (heavy imports go here); it
    raises :class:`stoker.ConfigError` for a usage error, which :func:`main` reports below the
    subcommand's usage with status 2.

To add a subcommand, add one row to ``_COMMANDS``.
"""

# Imports inside functions are deferred so that `stoker --help` starts without the tools.

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["USAGE_ERROR", "main"]

#: Exit status of a usage error (argparse's own).
USAGE_ERROR = 2

# name -> (module, one-line help). Kept in the order `stoker --help` shows them.
_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": (
        "stoker.bench._cli",
        "torch's DataLoader and stoker side by side on built-in workloads",
    ),
    "tune": ("stoker.tuner._cli", "search a fast loader configuration and write stoker.toml"),
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


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``stoker`` parser, and each subcommand's parser by name."""
    from stoker import __version__

    parser = argparse.ArgumentParser(
        prog="stoker",
        description="Keep PyTorch training fed: measure, diagnose and fix data loading.",
        epilog="Exit status: 0 success, 1 the work failed (or found errors), 2 a usage error.",
    )
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands: dict[str, argparse.ArgumentParser] = {}
    for name, (module_name, help_text) in _COMMANDS.items():
        module = importlib.import_module(module_name)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(sub_parser)
        sub_parser.set_defaults(_run=module.run)
        commands[name] = sub_parser
    return parser, commands


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """Print ``parser``'s usage and one line naming the problem on stderr, as argparse does
    for the errors it finds; return the usage-error status."""
    from stoker._commands.text import printable

    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: {printable(' '.join(message.split()))}", file=sys.stderr)
    return USAGE_ERROR


def _main(argv: list[str]) -> int:
    from stoker.errors import ConfigError

    parser, commands = _build_parser()
    # parse_known_args: an unknown argument is reported with its subcommand's usage (parse_args
    # would report it with the top-level usage, which does not list the subcommand's options).
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        return _usage_error(
            parser, f"name a COMMAND: {', '.join(_COMMANDS)} (`stoker --help` says what each does)."
        )
    command = commands[args.command]
    if unknown:
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args._run(args))
    except ConfigError as exc:
        return _usage_error(command, str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console script; returns the exit status.

    0: success; 1: the work failed (or, for ``doctor``, found errors); 2: a usage error (a bad
    argument, or a target that cannot be read, imported or called), reported as one line on
    stderr below the subcommand's usage. Output cut short by a closed pipe (``| head``) ends
    quietly with status 1, as Python's documentation advises.
    """
    try:
        status = _main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # a closed pipe shows up here rather than at exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        print("stoker: interrupted", file=sys.stderr)
        return 130


def _silence_stdout() -> None:
    """Point standard output at devnull, so that the flush at exit does not raise
    BrokenPipeError again (the recipe of Python's docs, "Note on SIGPIPE" in ``signal``)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a non-file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
