"""``stoker doctor TARGET``: static checks of a script, or runtime checks of a factory's loader.

Exit status: 0 when clean, 1 when an error-level finding exists (with ``--strict``, a warning
too), 2 when the target cannot be read, imported or called.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the doctor's arguments."""
    parser.add_argument(
        "target",
        metavar="SCRIPT.py | module:factory",
        help="a training script to check statically (not executed), or a zero-argument "
        "factory returning a DataLoader or Dataset, e.g. `mypkg.data:make_loader` or "
        "`train.py:make_loader`, to diagnose live",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 on warnings as well as errors"
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="(factory targets) fork real workers and measure their private-memory growth",
    )
    parser.add_argument(
        "--shm-dir",
        metavar="DIR",
        default=None,
        help="shared-memory directory to check (default: /dev/shm, or STOKER_SHM_DIR for "
        "stoker's loader)",
    )


def _is_script(target: str) -> bool:
    return target.endswith(".py") and ":" not in target.rsplit(".py", 1)[-1]


def run(args: argparse.Namespace) -> int:
    """Diagnose ``args.target`` and print the result; return the exit status."""
    from stoker.doctor._render import render_json, render_text
    from stoker.errors import ConfigError

    target: str = args.target
    try:
        if _is_script(target):
            from stoker.doctor._static import diagnose_script

            diagnosis = diagnose_script(target)
        else:
            from stoker.doctor._diagnose import diagnose
            from stoker.doctor._subject import load_factory

            factory = load_factory(target)
            try:
                obj = factory() if callable(factory) else factory
            except Exception as exc:
                print(
                    f"stoker doctor: the factory {target!r} raised {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                )
                return 2
            diagnosis = diagnose(
                obj, measure_memory=args.memory, shm_dir=args.shm_dir, target=target
            )
    except (OSError, SyntaxError, ConfigError) as exc:
        print(f"stoker doctor: {exc}", file=sys.stderr)
        return 2
    if args.json:
        render_json(diagnosis, sys.stdout)
    else:
        render_text(diagnosis)
    return diagnosis.exit_status(strict=args.strict)
