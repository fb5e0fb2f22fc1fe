"""``stoker doctor TARGET``: static checks of a script, or runtime checks of a factory's loader.

``stoker doctor --explain CODE`` prints a finding code's page (``--explain all``: every code).

Exit status: 0 when clean, 1 when an error-level finding exists (with ``--strict``, a warning
too), 2 when the target cannot be read, imported or called, or the code is unknown (a
:class:`ConfigError` that :func:`stoker.cli.main` reports below the usage).
"""

# Imports inside `run` are deferred so that the other `stoker` commands start without them.

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stoker.doctor._finding import Diagnosis

__all__ = ["EXPLAIN_ALL", "configure", "run"]

#: The ``--explain`` value that lists every code.
EXPLAIN_ALL = "all"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the doctor's arguments."""
    parser.add_argument(
        "target",
        nargs="?",
        default=None,
        metavar="SCRIPT.py | module:factory",
        help="a training script to check statically (read, not executed), or a zero-argument "
        "factory returning a DataLoader or Dataset, e.g. `mypkg.data:make_loader` or "
        "`train.py:make_loader`, to diagnose live. A factory's module is imported, which "
        "executes its top-level code (as `python train.py` would, less what sits under "
        "`if __name__ == '__main__':`), with the current directory on sys.path while it "
        "imports (and off it afterwards); then the factory is called",
    )
    parser.add_argument(
        "--explain",
        metavar="CODE",
        default=None,
        help="print what a finding code (e.g. SK012) checks and how to fix it, instead of "
        "diagnosing a target; `--explain all` lists every code",
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


def _diagnose(args: argparse.Namespace) -> Diagnosis:
    from stoker.errors import ConfigError

    target: str = args.target
    if _is_script(target):
        from stoker.doctor._static import diagnose_script

        try:
            return diagnose_script(target)
        except OSError as exc:
            raise ConfigError(
                f"cannot read the script {target!r}: {exc.strerror or exc}. Pass the path of a "
                "Python file, or `module:factory` to diagnose a loader live."
            ) from exc
        except SyntaxError as exc:
            where = f" (line {exc.lineno})" if exc.lineno else ""
            raise ConfigError(
                f"cannot parse the script {target!r}: {exc.msg}{where}. Pass a Python file "
                "that runs."
            ) from exc
    from stoker._commands.target import call_factory, describe_exception, importing_from_cwd
    from stoker.doctor._diagnose import diagnose
    from stoker.doctor._subject import load_factory

    try:
        with importing_from_cwd():
            factory = load_factory(target)
    except ConfigError:
        raise
    except Exception as exc:  # the module's top-level code raised (a SyntaxError included)
        raise ConfigError(
            f"importing the target {target!r} raised {describe_exception(exc)}."
        ) from exc
    obj = call_factory(factory, target) if callable(factory) else factory
    return diagnose(obj, measure_memory=args.memory, shm_dir=args.shm_dir, target=target)


def _explain(code: str) -> int:
    from stoker.doctor._codes import find_page, render_index, render_page
    from stoker.errors import ConfigError

    if code.strip().lower() == EXPLAIN_ALL:
        sys.stdout.write(render_index())
        return 0
    page = find_page(code)
    if page is None:
        raise ConfigError(
            f"unknown finding code {code!r} for `--explain`: `stoker doctor --explain "
            f"{EXPLAIN_ALL}` lists every code."
        )
    sys.stdout.write(render_page(page))
    return 0


def run(args: argparse.Namespace) -> int:
    """Diagnose ``args.target`` and print the result, or print the page of the finding code
    ``args.explain``; return the exit status.

    Raises:
        ConfigError: the target cannot be read, imported or called, both or neither of a
            target and ``--explain`` are given, or the code is unknown (status 2).
    """
    from stoker.doctor._render import render_json, render_text
    from stoker.errors import ConfigError

    if args.explain is not None:
        if args.target is not None:
            raise ConfigError(
                f"pass a TARGET or `--explain CODE`, not both. Found: {args.target!r} and "
                f"`--explain {args.explain}`."
            )
        return _explain(args.explain)
    if args.target is None:
        raise ConfigError(
            "name a TARGET (a script, or `module:factory`), or pass `--explain CODE` to read "
            f"what a finding code means (`--explain {EXPLAIN_ALL}` lists them)."
        )

    # With --json, standard output carries the JSON only: what the target prints goes to stderr.
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with quiet:
        diagnosis = _diagnose(args)
    if args.json:
        render_json(diagnosis, sys.stdout)
    else:
        from stoker._commands.console import console

        render_text(diagnosis, console=console())
    return diagnosis.exit_status(strict=args.strict)
