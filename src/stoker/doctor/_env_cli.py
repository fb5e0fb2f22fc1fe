"""``stoker env [--json] [--data-dir DIR] [--export environment.yml]``."""

# Imports inside `run` are deferred so that the other `stoker` commands start without them.

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the env command's arguments."""
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        default=None,
        help="report the filesystem type of this data directory (local disk, NFS, tmpfs...)",
    )
    parser.add_argument(
        "--export",
        metavar="FILE",
        default=None,
        help="write a reproducible environment file (conda's export where conda is active, "
        "else environment.yml with pinned pip packages)",
    )


def _size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "unknown"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= div:
            return f"{n / div:,.1f} {unit}"
    return f"{n:,} B"


def _rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    acc = facts["accelerators"]
    devices = ", ".join(d["name"] for d in acc["devices"]) or "none"
    if acc["mps_available"]:
        devices = "mps" if devices == "none" else devices + ", mps"
    cores = facts["cores"]
    quota = cores["cgroup_quota"]
    mem = facts["memory"]
    limit = mem["cgroup_limit_bytes"]
    shm = facts["shm"]
    files = facts["open_files"]
    env = facts["environment"]
    pools = ", ".join(f"{p['library']} {p['threads']}" for p in facts.get("thread_pools", []))
    rows = [
        ("python", f"{facts['python']['version']} ({facts['python']['executable']})"),
        ("torch", f"{facts['torch']['version']}, {facts['torch']['build']} build"),
        ("accelerators", devices),
        ("nvidia driver", acc["nvidia_driver"] or "none"),
        (
            "cores",
            f"{cores['usable']} usable (os.cpu_count {cores['os_cpu_count']}, affinity "
            f"{cores['affinity']}, cgroup quota {'none' if quota is None else f'{quota:g}'})",
        ),
        (
            "memory",
            f"{_size(mem['available_bytes'])} available of {_size(mem['total_bytes'])}"
            + (f", cgroup limit {_size(limit)}" if limit else ""),
        ),
        (
            "shared memory",
            f"{shm['dir']}: {_size(shm['free_bytes'])} free of {_size(shm['total_bytes'])}; "
            f"batches it has no room for go to {shm['spill_dir']} "
            f"({_size(shm['spill_free_bytes'])} free)",
        ),
        ("open files", f"soft {files['soft']}, hard {files['hard']} (-1: unlimited)"),
        (
            "start method",
            f"{facts['start_method']}; torch sharing {facts['torch']['sharing_strategy']}",
        ),
        ("torch threads", str(facts["torch"]["num_threads"])),
        (
            "thread env",
            ", ".join(f"{k}={v}" for k, v in facts["thread_env"].items()) or "none set",
        ),
        ("thread pools", pools or "unknown (install threadpoolctl)"),
        ("environment", f"{env['manager']}" + (f" ({env['name']})" if env["name"] else "")),
    ]
    if "data_dir" in facts:
        d = facts["data_dir"]
        rows.append(("data dir", f"{d['path']}: {d['fs_type'] or 'unknown'} ({d['kind']})"))
    return rows


def run(args: argparse.Namespace) -> int:
    """Print the facts (and export the environment file when asked); return the exit status.

    Raises:
        ConfigError: ``--data-dir`` is not a directory, or ``--export`` names a file that
            cannot be written (a usage error, status 2).
    """
    from stoker._commands.output import check_output_path
    from stoker.doctor._env import collect_env, export_environment
    from stoker.errors import ConfigError

    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise ConfigError(
            f"`--data-dir {args.data_dir}` is not a directory: name the folder the data is read "
            "from."
        )
    if args.export:
        check_output_path(args.export, "--export")
    facts = collect_env(args.data_dir)
    if args.export:
        try:
            facts["export"] = {"path": args.export, "how": export_environment(args.export)}
        except OSError as exc:
            print(f"stoker env: cannot write {args.export!r}: {exc}", file=sys.stderr)
            return 1
    if args.json:
        json.dump(facts, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table
    from rich.text import Text

    from stoker._commands.console import console

    table = Table(title="stoker env", show_header=False, box=None, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in _rows(facts):  # values are text (a path, an env name), never markup
        table.add_row(key, Text(value))
    out = console()
    out.print(table)
    if "export" in facts:
        out.print(Text(f"wrote {facts['export']['path']} ({facts['export']['how']})"))
    return 0
