"""``stoker pack SRC OUT``: a dataset into indexed, WebDataset-compatible tar shards."""

from __future__ import annotations

import argparse
import re
import sys

__all__ = ["configure", "parse_size", "run"]

_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 2**30, ``"4096"`` -> 4096.

    Raises:
        argparse.ArgumentTypeError: for anything else.
    """
    match = _SIZE_RE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 256MB, 1GiB or 1000000)")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``stoker pack``'s arguments."""
    parser.add_argument(
        "source",
        metavar="SRC",
        help="image folder, directory of files grouped by stem, LMDB environment, HDF5 file, "
        "or module:factory",
    )
    parser.add_argument(
        "out", metavar="OUT", help="output directory (created; must be empty unless --resume)"
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
    parser.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")


def run(args: argparse.Namespace) -> int:
    """Pack; print a summary. Returns 0, or 1 with a message on a shard error."""
    from stoker.errors import StokerError
    from stoker.shards._pack import pack

    fields = [f for f in args.fields.split(",") if f] if args.fields else None
    try:
        index = pack(
            args.source,
            args.out,
            shard_size=args.shard_size,
            workers=args.workers,
            resume=args.resume,
            format=args.format,
            fields=fields,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    except StokerError as exc:
        print(f"stoker pack: {exc}", file=sys.stderr)
        return 1
    size = sum(s.size for s in index.shards)
    print(
        f"packed {index.samples} samples into {len(index.shards)} shards "
        f"({size / 1e6:,.1f} MB) in {args.out}"
    )
    return 0
