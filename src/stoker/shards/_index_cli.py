"""``stoker index DIR``: build ``index.json`` for tar shards written by other tools.

Exit status (:func:`stoker.cli.main`'s convention): 0 when indexed; 2 when DIR cannot be used
as given (it does not exist, is not a folder, holds no ``.tar`` file, or other users may write
to it: :func:`run` raises the :class:`stoker.ConfigError`); 1 when a shard cannot be indexed,
with one line on stderr.
"""

# Imports inside `run` are deferred so that the other `stoker` commands start without them.

from __future__ import annotations

import argparse

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``stoker index``'s arguments."""
    parser.add_argument(
        "directory",
        metavar="DIR",
        help="directory of .tar shards (e.g. from webdataset.ShardWriter), or a store prefix "
        "(s3://bucket/prefix)",
    )


def run(args: argparse.Namespace) -> int:
    """Index the shards; print a summary. Returns 0, or 1 with one line on stderr when a shard
    cannot be indexed.

    Raises:
        ConfigError: a usage error (reported by :func:`stoker.cli.main`, status 2).
    """
    from stoker.errors import ConfigError, StokerError
    from stoker.shards._describe import build_index
    from stoker.shards._pack_cli import report_failure
    from stoker.shards._upload import index_store
    from stoker.store import StoreURL, parse_url

    try:
        where = parse_url(args.directory)
        index = index_store(where) if isinstance(where, StoreURL) else build_index(where)
    except ConfigError:
        raise
    except (StokerError, OSError) as exc:
        return report_failure("index", exc)
    print(f"indexed {index.samples} samples in {len(index.shards)} shards of {args.directory}")
    return 0
