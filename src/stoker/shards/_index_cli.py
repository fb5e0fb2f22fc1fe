"""``stoker index DIR``: build ``index.json`` for tar shards written by other tools."""

from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``stoker index``'s arguments."""
    parser.add_argument(
        "directory",
        metavar="DIR",
        help="directory of .tar shards (e.g. from webdataset.ShardWriter)",
    )


def run(args: argparse.Namespace) -> int:
    """Index the shards; print a summary. Returns 0, or 1 with a message on a shard error."""
    from stoker.errors import StokerError
    from stoker.shards._index import build_index

    try:
        index = build_index(args.directory)
    except StokerError as exc:
        print(f"stoker index: {exc}", file=sys.stderr)
        return 1
    print(f"indexed {index.samples} samples in {len(index.shards)} shards of {args.directory}")
    return 0
