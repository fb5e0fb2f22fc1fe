"""``stoker bench``: the command line around :func:`stoker.bench.run`.

Examples::

    stoker bench --quick --plot bench.png          # the README's main command (< 2 min)
    stoker bench --workload jpeg --workload io     # chosen workloads, full measurements
    stoker bench --dataset mymod:make_dataset --batch-size 64 --json mine.json
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["configure", "load_factory", "run"]

WORKLOAD_NAMES = (
    "tiny", "large", "jpeg", "heavytail", "io", "memory", "epochs", "shards", "remote",
)  # fmt: skip
DEFAULT_USER_BATCH = 64


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``stoker bench``'s arguments to ``parser``."""
    parser.add_argument(
        "--workload",
        "-w",
        action="append",
        metavar="NAME",
        dest="workloads",
        help=f"workload to run (repeatable): {', '.join(WORKLOAD_NAMES)}. Default: all, or "
        "tiny, large and jpeg with --quick.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short runs, 3 repeats, reduced torch grid: under 2 minutes",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        metavar="N",
        help="timed runs per contender (default 3 with --quick, else 5)",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="write every measurement as JSON (schema stoker.bench/1)"
    )
    parser.add_argument(
        "--plot", metavar="PATH", help="write a PNG bar chart of the ratios (needs matplotlib)"
    )
    parser.add_argument(
        "--dataset",
        metavar="MODULE:FACTORY",
        help="bench your own dataset: FACTORY() returns a Dataset. MODULE is imported, which "
        "runs its top-level code, with the current directory on sys.path while it imports "
        "(and off it afterwards)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help=f"batch size for --dataset (default {DEFAULT_USER_BATCH})",
    )
    parser.add_argument(
        "--start-method",
        choices=("fork", "spawn", "forkserver"),
        help="multiprocessing start method for every loader (default: the platform's)",
    )
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument(
        "--latency-ms",
        type=float,
        metavar="MS",
        help="the remote workload's store: milliseconds added to each request (default 50)",
    )
    parser.add_argument(
        "--bandwidth-mbs",
        type=float,
        metavar="MB/S",
        help="the remote workload's store: MB/s per connection, 0 for no cap (default 50)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda",),
        help="measure the host-to-device path on the GPU instead (H2D GB/s against a plain "
        "pinned copy, GPU idle fraction of a training loop; needs CUDA)",
    )


def load_factory(spec: str, option: str = "--dataset") -> Any:
    """Import ``"module:attribute"`` and return it (:func:`stoker._commands.target.import_factory`).

    Args:
        spec: ``"module:factory"``.
        option: the command-line argument that gave it, for the messages.

    Raises:
        ConfigError: if the spec is malformed, the module does not import or the attribute
            is missing or not callable.
    """
    from stoker._commands.target import import_factory

    return import_factory(spec, option)


class _BarProgress:
    """A rich progress bar on a terminal; one plain line per step otherwise."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.live = console.is_terminal
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _BarProgress:
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def start(self, total: int) -> None:
        if self.bar is not None:
            self.task = self.bar.add_task("stoker bench", total=total)

    def advance(self, message: str, steps: int = 1) -> None:
        if self.bar is not None:
            kwargs = {"description": message} if message else {}
            self.bar.update(self.task, advance=steps, **kwargs)
        elif message:
            self.console.print(message, markup=False, highlight=False)


# Over 80 lines: one branch per mode of the command (list, GPU, own dataset, built-ins).
def run(args: argparse.Namespace) -> int:
    """Run ``stoker bench`` with parsed ``args``; returns the exit status.

    Raises:
        ConfigError: a usage error (reported by :func:`stoker.cli.main`, status 2).
    """
    import sys
    import warnings

    from stoker import bench
    from stoker._commands.console import console
    from stoker._commands.output import check_output_path
    from stoker._commands.target import call_factory
    from stoker.bench._json import write_json
    from stoker.bench._report import render
    from stoker.bench._workloads import Workload
    from stoker.errors import ConfigError

    if args.list:
        for w in bench.builtin_workloads().values():
            tag = " (quick)" if w.in_quick else ""
            print(f"{w.name:<10} batch {w.batch_size:<4} {w.description}{tag}")
        return 0
    if args.device:
        from stoker.bench._gpu import render as render_gpu
        from stoker.bench._gpu import run_gpu_bench

        print(render_gpu(run_gpu_bench(args.device)))
        return 0
    if args.batch_size is not None and not args.dataset:
        raise ConfigError("`--batch-size` applies to `--dataset` only.")
    if args.json:
        check_output_path(args.json, "--json")
    if args.plot:
        check_output_path(args.plot, "--plot")
    chosen: list[str | Workload] | None = list(args.workloads) if args.workloads else None
    if chosen is not None:
        known = bench.builtin_workloads()
        for name in chosen:
            if name not in known:
                raise ConfigError(f"unknown workload {name!r}: pick one of {', '.join(known)}.")
    if args.latency_ms is not None or args.bandwidth_mbs is not None:
        from stoker.bench._remote import configured  # lazy, as every import here: start-up

        chosen = configured(chosen, args.latency_ms, args.bandwidth_mbs)
    if args.dataset:
        # Built once, now: a factory that raises is reported before minutes of measuring.
        dataset = call_factory(load_factory(args.dataset), args.dataset)
        batch = args.batch_size if args.batch_size is not None else DEFAULT_USER_BATCH
        user = Workload(
            name=args.dataset,
            description=f"your dataset ({args.dataset}())",
            make_dataset=lambda quick: dataset,
            batch_size=batch,
        )
        chosen = [*(chosen or []), user]
    from stoker.bench._peer_noise import quiet_peer_teardown

    err = console(stderr=True)
    with warnings.catch_warnings(), _BarProgress(err) as progress, quiet_peer_teardown() as noise:
        # torch warns for every grid point above its suggested worker count: expected here.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        result = bench.run(
            chosen,
            quick=args.quick,
            repeats=args.repeats,
            multiprocessing_context=args.start_method,
            progress=progress,
        )
    render(result, console())
    if noise.total:
        print(
            f"  torchdata: {noise.total} error{'s' if noise.total != 1 else ''} in its own "
            "teardown (after timing) not shown (a known race of its process mapper)",
            file=sys.stderr,
        )
    try:
        if args.json:
            write_json(result, args.json)
            print(f"wrote {args.json}", file=sys.stderr)
        if args.plot:
            from stoker.bench._plot import plot

            plot(result, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    except OSError as exc:
        print(f"stoker bench: cannot write the results: {exc}", file=sys.stderr)
        return 1
    return 0
