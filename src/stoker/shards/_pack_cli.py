"""``stoker pack SRC OUT``: a dataset into indexed, WebDataset-compatible tar shards.

Exit status (:func:`stoker.cli.main`'s convention): 0 when packed; 2 when the command was
called wrong (a value argparse or stoker refuses: a missing SRC, a non-empty OUT or one other
users may write to, ``--workers 0``: :func:`run` raises the :class:`stoker.ConfigError`, and
``main`` prints it below the usage); 1 when the work failed (an unreadable source file, a
killed worker, a full disk), with one line on stderr.
"""

# Imports inside `run` are deferred so that the other `stoker` commands start without them.

from __future__ import annotations

import argparse
import sys
import warnings

from stoker._commands.text import printable

__all__ = ["configure", "parse_size", "report_failure", "run"]


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 2**30, ``"4096"`` -> 4096.

    Raises:
        argparse.ArgumentTypeError: for anything else.
    """
    from stoker.errors import ConfigError  # here, as in run(): `stoker --help` stays fast
    from stoker.store import parse_bytes

    try:
        size = parse_bytes(text, "size")
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (try 256MB, 1GiB or 1000000)"
        ) from None
    assert size is not None  # parse_bytes returns None only for None
    return size


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``stoker pack``'s arguments."""
    parser.add_argument(
        "source",
        metavar="SRC",
        help="image folder, directory of files grouped by stem, LMDB environment, HDF5 file, "
        "or module:factory",
    )
    parser.add_argument(
        "out",
        metavar="OUT",
        help="output directory (created; must be empty unless --resume), or a store prefix "
        "(s3://bucket/prefix, gs://, az://)",
    )
    parser.add_argument(
        "--shard-size",
        type=parse_size,
        default="256MB",
        help="upper bound of each shard (default 256MB)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes reading and encoding samples; the output is the same for any N (default 1)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted pack into OUT (same SRC and options)",
    )
    parser.add_argument(
        "--format",
        default="auto",
        choices=["auto", "imagefolder", "files", "lmdb", "hdf5", "factory"],
        help="kind of SRC (default: guess)",
    )
    parser.add_argument(
        "--fields",
        default=None,
        help="comma-separated: HDF5 datasets to pack, or extensions naming the parts of tuple "
        "samples (e.g. jpg,cls)",
    )
    parser.add_argument(
        "--follow-links",
        action="store_true",
        help="follow symbolic links in a SRC folder when their target is inside SRC (default: "
        "skip them); FIFOs, sockets and devices are always skipped, with a warning",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")


def _show_warning(message: Warning | str, *_: object, **__: object) -> None:
    print(f"stoker pack: warning: {printable(str(message))}", file=sys.stderr)


def report_failure(command: str, exc: BaseException) -> int:
    """Print a failed run's error as one line on stderr; return exit status 1."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    print(f"stoker {command}: {printable(message)}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    """Pack; print a summary. Returns 0, or 1 with one line on stderr when the work fails.

    Raises:
        ConfigError: a usage error (reported by :func:`stoker.cli.main`, status 2).
    """
    from stoker.errors import ConfigError, StokerError
    from stoker.shards._pack import pack

    fields = [f for f in args.fields.split(",") if f] if args.fields else None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning  # one plain line, no source location
            index = pack(
                args.source,
                args.out,
                shard_size=args.shard_size,
                workers=args.workers,
                resume=args.resume,
                format=args.format,
                fields=fields,
                progress=not args.no_progress and sys.stderr.isatty(),
                follow_links=args.follow_links,
            )
    except ConfigError:
        raise
    except (StokerError, OSError) as exc:
        return report_failure("pack", exc)
    size = sum(s.size for s in index.shards)
    print(
        f"packed {index.samples} sample{'s' if index.samples != 1 else ''} into "
        f"{len(index.shards)} shard{'s' if len(index.shards) != 1 else ''} "
        f"({size / 1e6:,.1f} MB) in {args.out}"
    )
    return 0
