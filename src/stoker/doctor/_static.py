"""Static checks of a training script (``stoker doctor train.py``): the AST only, no execution.

Codes SK001-SK012. Each check takes the parsed :class:`~stoker.doctor._script.Script` and
returns findings that name the line.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from stoker._introspect import platform as _platform
from stoker._introspect.main_guard import (
    loader_names,
    mentions,
    workers_started_on_import,
)
from stoker._introspect.script import Script, parse_script
from stoker.doctor._finding import Diagnosis, Finding, Severity

__all__ = ["STATIC_CHECKS", "diagnose_script"]

_SPAWN_NOTE = (
    "spawn is the default start method on macOS and Windows, and forkserver on Linux from "
    "Python 3.14"
)
_PICKLED_KEYWORDS = frozenset({"collate_fn", "worker_init_fn"})


def _check_main_guard(script: Script) -> Iterator[Finding]:
    """SK001 (workers started on import) and SK002 (worker loader built on import)."""
    names = loader_names(script)
    iterated_at_import: set[str] = set()
    for stmt, culprit in workers_started_on_import(script):
        iterated_at_import |= {n for n in names if mentions(stmt, {n})}
        yield Finding(
            "SK001",
            Severity.ERROR,
            'DataLoader workers are started outside `if __name__ == "__main__":`',
            f"line {stmt.lineno} runs on import and starts workers: `{script.segment(culprit)}`",
            "Under spawn or forkserver each worker imports the main module again and re-runs "
            "this line, so the worker tries to start workers of its own and dies with "
            "'RuntimeError: An attempt has been made to start a new process before the current "
            f"process has finished its bootstrapping phase' ({_SPAWN_NOTE}).",
            "def main():\n    ...  # build the dataset and loader, run the loop\n\n\n"
            'if __name__ == "__main__":\n    main()',
            script.where(stmt),
        )
    for call in script.loaders:
        if not (call.place.module_level and script.may_have_workers(call)):
            continue
        if call.names & iterated_at_import:
            continue
        yield Finding(
            "SK002",
            Severity.WARNING,
            "A DataLoader with workers is built at import time",
            f"line {call.line} builds `{script.segment(call.node)}` at module level",
            "Under spawn or forkserver every worker imports the main module, so each one "
            "rebuilds this dataset and loader before it can load a sample: startup costs "
            f"num_workers times the dataset's construction and memory ({_SPAWN_NOTE}).",
            "def main():\n    loader = DataLoader(...)\n    ...\n\n\n"
            'if __name__ == "__main__":\n    main()',
            script.where(call.node),
        )


def _unpicklable_parts(script: Script, node: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Lambdas, nested functions and names bound to lambdas inside an argument expression."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Lambda):
            yield sub, "a lambda"
        elif isinstance(sub, ast.Name) and sub.id in script.lambda_names:
            yield sub, f"`{sub.id}`, a name bound to a lambda"
        elif isinstance(sub, ast.Name) and sub.id in script.nested_functions:
            yield sub, f"`{sub.id}`, a function defined inside another function"


def _check_unpicklable_callables(script: Script) -> Iterator[Finding]:
    """SK003: lambdas / local functions given as transforms, collate_fn or worker_init_fn."""
    spawn = script.start_method in ("spawn", "forkserver")
    severity = Severity.ERROR if spawn else Severity.WARNING
    when = (
        f"This script selects {script.start_method!r}, so the loader will fail at the first "
        "`iter()`"
        if spawn
        else f"It works under fork (Linux's default before Python 3.14) but fails under "
        f"spawn/forkserver ({_SPAWN_NOTE})"
    )
    seen: set[int] = set()
    for call in (n for n in ast.walk(script.tree) if isinstance(n, ast.Call)):
        for kw in call.keywords:
            if kw.arg is None or not (kw.arg in _PICKLED_KEYWORDS or "transform" in kw.arg):
                continue
            for bad, what in _unpicklable_parts(script, kw.value):
                if id(bad) in seen:
                    continue
                seen.add(id(bad))
                yield Finding(
                    "SK003",
                    severity,
                    f"`{kw.arg}` is given {what.split(',')[0]}, which cannot be pickled",
                    f"line {getattr(bad, 'lineno', '?')}: "
                    f"`{kw.arg}={script.segment(kw.value)}` passes {what}",
                    "Workers started by spawn or forkserver receive the dataset, `collate_fn` "
                    "and `worker_init_fn` by pickle, and pickle stores functions by their "
                    "importable module-level name: lambdas and nested functions have none "
                    f"('Can't pickle <function <lambda>>'). {when}.",
                    "# define it at module level (importable by name), or use functools.partial"
                    "\ndef to_float(x):\n    return x.float() / 255\n\n"
                    f"...({kw.arg}=to_float)",
                    script.where(bad),
                )
    for node in ast.walk(script.tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Lambda)
            and any(
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                for t in node.targets
            )
            and id(node.value) not in seen
        ):
            target = script.segment(node.targets[0])
            yield Finding(
                "SK003",
                severity,
                f"`{target}` holds a lambda, so the dataset cannot be pickled",
                f"line {node.lineno}: `{script.segment(node)}`",
                "A dataset is pickled, with every attribute, to each worker started by spawn or "
                f"forkserver; an attribute holding a lambda makes that fail. {when}.",
                f"# a method or a module-level function instead of the lambda\n"
                f"def _transform(x):\n    return ...\n\n{target} = _transform",
                script.where(node),
            )


def _check_zero_worker_options(script: Script) -> Iterator[Finding]:
    """SK004 persistent_workers and SK005 prefetch_factor with num_workers=0."""
    for call in script.loaders:
        if script.workers(call) != 0:
            continue
        shown = script.segment(call.args.get("num_workers") or call.node)
        if script.bool_value(call.args.get("persistent_workers")) is True:
            yield Finding(
                "SK004",
                Severity.ERROR,
                "`persistent_workers=True` with `num_workers=0`",
                f"line {call.line}: `{script.segment(call.node)}` (num_workers is {shown}: 0)",
                "torch raises 'ValueError: persistent_workers option needs num_workers > 0' "
                "when the loader is built: there are no workers to keep.",
                "DataLoader(..., num_workers=4, persistent_workers=True)\n"
                "# or drop persistent_workers when loading in the main process",
                script.where(call.node),
            )
        prefetch = call.args.get("prefetch_factor")
        if prefetch is not None and not (
            isinstance(prefetch, ast.Constant) and prefetch.value is None
        ):
            yield Finding(
                "SK005",
                Severity.ERROR,
                "`prefetch_factor` with `num_workers=0`",
                f"line {call.line}: `{script.segment(call.node)}`",
                "torch raises 'ValueError: prefetch_factor option could only be specified in "
                "multiprocessing' when the loader is built: without workers nothing is "
                "prefetched.",
                "DataLoader(..., num_workers=4, prefetch_factor=2)\n"
                "# or remove prefetch_factor when num_workers=0",
                script.where(call.node),
            )


def _has_non_blocking(script: Script) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(script.tree)
        if isinstance(n, ast.Call)
        and any(
            kw.arg == "non_blocking"
            and isinstance(kw.value, ast.Constant)
            and kw.value.value is True
            for kw in n.keywords
        )
    ]


def _check_pin_memory(script: Script) -> Iterator[Finding]:
    """SK006 pin_memory without non_blocking copies, SK007 the reverse."""
    copies = _has_non_blocking(script)
    candidates = [c for c in script.loaders if "device" not in c.args]
    pinned = [c for c in candidates if script.bool_value(c.args.get("pin_memory")) is True]
    unknown = [
        c
        for c in candidates
        if "pin_memory" in c.args and script.bool_value(c.args["pin_memory"]) is None
    ]
    if pinned and not copies:
        for call in pinned:
            yield Finding(
                "SK006",
                Severity.WARNING,
                "`pin_memory=True` but no copy uses `non_blocking=True`",
                f"line {call.line} pins every batch, and no `.to(..., non_blocking=True)` or "
                "`.cuda(non_blocking=True)` appears in the script",
                "Pinning costs an extra host copy of every batch; it pays off only when the "
                "host-to-device copy is asynchronous and overlaps compute. With blocking "
                "copies the pin is pure overhead (and on a CPU-only machine it does nothing).",
                "for x, y in loader:\n"
                "    x = x.to(device, non_blocking=True)\n"
                "    y = y.to(device, non_blocking=True)",
                script.where(call.node),
            )
    if copies and script.loaders and not pinned and not unknown and candidates:
        first = copies[0]
        yield Finding(
            "SK007",
            Severity.WARNING,
            "`non_blocking=True` copies from unpinned batches",
            f"line {first.lineno}: `{script.segment(first)}`, but no DataLoader in the script "
            "sets `pin_memory=True`",
            "A host-to-device copy is asynchronous only from page-locked (pinned) memory; from "
            "ordinary memory `non_blocking=True` silently becomes a synchronous copy, so the "
            "copy does not overlap compute.",
            "loader = DataLoader(..., pin_memory=torch.cuda.is_available())",
            script.where(first),
        )


def _check_worker_count(script: Script, cores: int) -> Iterator[Finding]:
    """SK008 num_workers from cpu_count(), SK009 more workers than usable cores."""
    for call in script.loaders:
        node = call.args.get("num_workers")
        if node is not None and script.uses_cpu_count(node):
            yield Finding(
                "SK008",
                Severity.WARNING,
                "`num_workers` is taken from `cpu_count()`",
                f"line {call.line}: `num_workers={script.segment(node)}`; on this machine "
                f"os.cpu_count() is {_platform_cpu_count()} and usable cores are {cores}",
                "cpu_count() reports the host's cores: in a container or under a CPU affinity "
                "mask it can be many times what the process may use, and it leaves no core for "
                "the training loop, so workers contend with it and with each other.",
                "from stoker._introspect.platform import usable_cores  # affinity, cgroup quota\n"
                "num_workers = max(1, usable_cores() - 1)\n"
                '# or: stoker.DataLoader(..., num_workers="auto")',
                script.where(node or call.node),
            )
            continue
        workers = script.workers(call)
        if workers is not None and workers > cores:
            yield Finding(
                "SK009",
                Severity.WARNING,
                "More workers than usable cores",
                f"line {call.line}: `num_workers={workers}` but this machine has {cores} "
                "usable cores (CPU affinity and cgroup quota)",
                "Workers beyond the usable cores do not load faster; they time-share the same "
                "cores, add memory (each holds a copy of what it reads) and steal CPU from the "
                "training loop.",
                f"DataLoader(..., num_workers={max(1, cores - 1)})",
                script.where(node or call.node),
            )


def _platform_cpu_count() -> int:
    return os.cpu_count() or 1


def _check_loader_in_loop(script: Script) -> Iterator[Finding]:
    """SK010: a DataLoader with workers built inside a loop body (every epoch)."""
    for call in script.loaders:
        loop = call.place.loop
        if loop is None or not script.may_have_workers(call):
            continue
        yield Finding(
            "SK010",
            Severity.WARNING,
            "A DataLoader is built inside a loop",
            f"line {call.line}: `{script.segment(call.node)}` is rebuilt on every pass of the "
            f"loop at line {loop.lineno}",
            "Each new loader starts its workers from scratch (a fork or spawn per worker, the "
            "dataset copied or pickled again, the first batch waits for all of it) and "
            "`persistent_workers` cannot help because the old loader is thrown away.",
            "loader = DataLoader(..., num_workers=4, persistent_workers=True)  # once\n"
            "for epoch in range(epochs):\n"
            "    for batch in loader:\n"
            "        ...",
            script.where(call.node),
        )


def _check_set_epoch(script: Script) -> Iterator[Finding]:
    """SK011: a DistributedSampler and no `set_epoch` call anywhere."""
    from stoker.doctor._distributed import loader_drives_epoch

    if script.calls("set_epoch") or loader_drives_epoch(script):
        return
    for node in script.calls("DistributedSampler"):
        yield Finding(
            "SK011",
            Severity.WARNING,
            "DistributedSampler without `set_epoch`",
            f"line {node.lineno}: `{script.segment(node)}`, and the script never calls `set_epoch`",
            "DistributedSampler shuffles with seed + epoch; without `set_epoch(epoch)` every "
            "epoch sees the same order on every rank, which hurts convergence silently.",
            "for epoch in range(epochs):\n    sampler.set_epoch(epoch)\n    for batch in loader:"
            "\n        ...",
            script.where(node),
        )


def _check_shuffle_with_sampler(script: Script) -> Iterator[Finding]:
    """SK012: shuffle=True together with sampler= or batch_sampler=."""
    for call in script.loaders:
        if script.bool_value(call.args.get("shuffle")) is not True:
            continue
        other = next((k for k in ("sampler", "batch_sampler") if k in call.args), None)
        value = call.args[other] if other is not None else None
        if value is None or (isinstance(value, ast.Constant) and value.value is None):
            continue
        yield Finding(
            "SK012",
            Severity.ERROR,
            f"`shuffle=True` together with `{other}`",
            f"line {call.line}: `{script.segment(call.node)}`",
            f"torch raises 'ValueError: {other} option is mutually exclusive with shuffle': the "
            "sampler decides the order, so shuffling belongs to the sampler.",
            "sampler = DistributedSampler(ds, shuffle=True)  # or RandomSampler(ds)\n"
            "loader = DataLoader(ds, sampler=sampler)  # no shuffle=",
            script.where(call.node),
        )


STATIC_CHECKS: tuple[Callable[[Script], Iterator[Finding]], ...] = (
    _check_main_guard,
    _check_unpicklable_callables,
    _check_zero_worker_options,
    _check_pin_memory,
    _check_loader_in_loop,
    _check_set_epoch,
    _check_shuffle_with_sampler,
)


def diagnose_script(path: str | Path, *, usable_cores: int | None = None) -> Diagnosis:
    """Run the static checks (SK001-SK012) on a script without executing it.

    Args:
        path: the script.
        usable_cores: cores to compare ``num_workers`` with. Default: this machine's (CPU
            affinity and cgroup quota).

    Returns:
        The diagnosis; each finding's ``location`` is ``path:line``.

    Raises:
        OSError: if the script cannot be read.
        SyntaxError: if it is not valid Python.
    """
    script = parse_script(path)
    cores = usable_cores if usable_cores is not None else _platform.usable_cores()
    findings: list[Finding] = []
    from stoker.doctor._distributed import DISTRIBUTED_CHECKS

    for check in (*STATIC_CHECKS, *DISTRIBUTED_CHECKS):
        findings.extend(check(script))
    findings.extend(_check_worker_count(script, cores))
    facts = {
        "usable_cores": cores,
        "dataloaders": len(script.loaders),
        "start_method": script.start_method,
    }
    return Diagnosis(target=str(path), findings=tuple(findings), facts=facts)
