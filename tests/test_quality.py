"""The house rules as tests, so that the README's one test command checks them too: ruff
(lint and format), mypy on the package, and the import layers (import-linter contracts in
pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# mypy on a cold cache takes about a minute on two cores.
CHECK_LIMIT_S = 600


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=ROOT, capture_output=True, text=True, timeout=CHECK_LIMIT_S
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("-m", "ruff", "check", "src", "tests", "benchmarks"),
        ("-m", "ruff", "format", "--check", "src", "tests", "benchmarks"),
        ("-m", "mypy"),
    ],
    ids=["ruff", "ruff-format", "mypy"],
)
def test_code_is_clean(argv: tuple[str, ...]) -> None:
    done = _run(sys.executable, *argv)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"


def test_import_layers_hold() -> None:
    done = _run(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(imports.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_even_through_imports_inside_functions() -> None:
    """grimp reads every import statement, those inside functions and under TYPE_CHECKING too:
    an import moved into a function to dodge a cycle is still a cycle."""
    import grimp

    graph = grimp.build_graph("stoker", cache_dir=None)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(imports) == []
