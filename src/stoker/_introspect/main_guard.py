"""Where a training script starts DataLoader workers on import, outside its
``if __name__ == "__main__":`` guard (what a spawn or forkserver worker re-runs and dies of).

Shared by the loader (why a spawn worker died before it reported) and ``stoker doctor``
(SK001).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from stoker._introspect.script import Script, call_name, is_main_guard

__all__ = ["loader_names", "mentions", "module_level_statements", "workers_started_on_import"]

_ITERATING_CALLS = frozenset({"iter", "next", "list", "enumerate", "tqdm", "zip", "tuple"})


def loader_names(script: Script) -> set[str]:
    return {n for c in script.loaders if script.may_have_workers(c) for n in c.names}


def mentions(node: ast.AST, names: set[str]) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id in names)
        or (isinstance(n, ast.Attribute) and n.attr in names)
        for n in ast.walk(node)
    )


def module_level_statements(script: Script) -> Iterator[ast.stmt]:
    """Statements that run on import (top level, not under the main guard)."""
    for stmt in script.tree.body:
        if not isinstance(
            stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        ) and not is_main_guard(stmt):
            yield stmt


def workers_started_on_import(script: Script) -> Iterator[tuple[ast.stmt, ast.AST]]:
    """Each statement that runs on import and starts a loader's workers, with the expression
    that starts them (iterating the loader, or calling a function that does)."""
    names = loader_names(script)
    for stmt in module_level_statements(script):
        if not script.place(stmt).module_level:
            continue
        culprit: ast.AST | None = None
        if isinstance(stmt, (ast.For, ast.AsyncFor)) and mentions(stmt.iter, names):
            culprit = stmt.iter
        for node in ast.walk(stmt):
            if culprit is not None:
                break
            if not isinstance(node, ast.Call):
                continue
            name = call_name(node)
            if name in _ITERATING_CALLS and any(mentions(a, names) for a in node.args):
                culprit = node
            elif (
                isinstance(node.func, ast.Name)
                and name is not None
                and script.reaches_worker_loader(name)
            ):
                culprit = node
        if culprit is not None:
            yield stmt, culprit
