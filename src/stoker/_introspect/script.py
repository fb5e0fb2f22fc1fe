"""A parsed training script, as the static checks see it (no code is executed).

The model is deliberately small: every ``DataLoader(...)`` call with its arguments resolved
(literal values and module-level integer constants), the names those loaders are bound to,
where each call sits (inside a function, under an ``if __name__ == "__main__":`` guard, inside
a loop), the functions the script defines (and which are nested, hence not picklable), names
bound to lambdas, and the start method the script selects explicitly.
"""

from __future__ import annotations

import ast
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LoaderCall", "Script", "call_name", "is_main_guard", "parse_script"]

# torch.utils.data.DataLoader's positional parameters, in order.
LOADER_POSITIONAL = (
    "dataset",
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
)
_CPU_COUNT_NAMES = frozenset({"cpu_count"})
_SEGMENT_MAX = 110


def call_name(node: ast.AST, aliases: dict[str, str] | None = None) -> str | None:
    """The called name of a call (``DataLoader`` for ``torch.utils.data.DataLoader(...)``)."""
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Name):
        return (aliases or {}).get(func.id, func.id)
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def is_main_guard(node: ast.AST) -> bool:
    """True for ``if __name__ == "__main__":`` (either operand order)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    has_name = any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    has_main = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    return has_name and has_main


@dataclass
class Place:
    """Where a node sits in the script."""

    function: ast.FunctionDef | ast.AsyncFunctionDef | None  # innermost enclosing def
    guarded: bool  # under `if __name__ == "__main__":`
    loop: ast.For | ast.AsyncFor | ast.While | None  # innermost loop whose body holds it

    @property
    def module_level(self) -> bool:
        """True when the node runs on import: not in a def, not under the main guard."""
        return self.function is None and not self.guarded


@dataclass
class LoaderCall:
    """One ``DataLoader(...)`` call."""

    node: ast.Call
    args: dict[str, ast.expr]
    place: Place
    names: set[str] = field(default_factory=set)  # names/attributes it is assigned to
    from_stoker: bool = False

    @property
    def line(self) -> int:
        return self.node.lineno


@dataclass
class Script:
    """Everything the static checks need about one script."""

    path: Path
    source: str
    tree: ast.Module
    parents: dict[ast.AST, ast.AST]
    aliases: dict[str, str]  # local name -> imported name (``DL`` -> ``DataLoader``)
    stoker_names: set[str]  # local names imported from stoker
    constants: dict[str, object]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
    nested_functions: set[str]
    lambda_names: set[str]
    loaders: list[LoaderCall]
    start_method: str | None  # "spawn"/"forkserver"/"fork" when the script picks one

    def where(self, node: ast.AST) -> str:
        """``file.py:LINE`` for a node."""
        return f"{self.path}:{getattr(node, 'lineno', '?')}"

    def segment(self, node: ast.AST) -> str:
        """The node's source text on one line, shortened to ~110 characters."""
        text = ast.get_source_segment(self.source, node) or ast.unparse(node)
        text = " ".join(text.split())
        return text if len(text) <= _SEGMENT_MAX else text[: _SEGMENT_MAX - 3] + "..."

    def place(self, node: ast.AST) -> Place:
        """Find the enclosing def, main guard and loop of ``node``."""
        function = None
        guarded = False
        loop = None
        child = node
        parent = self.parents.get(child)
        while parent is not None:
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and function is None:
                function = parent
            if is_main_guard(parent) and child in parent.body:  # type: ignore[attr-defined]
                guarded = True
            if (
                loop is None
                and function is None
                and isinstance(parent, (ast.For, ast.AsyncFor, ast.While))
                and child in parent.body
            ):
                loop = parent
            child, parent = parent, self.parents.get(parent)
        return Place(function=function, guarded=guarded, loop=loop)

    def int_value(self, node: ast.expr | None) -> int | None:
        """The value of a literal int (or a module-level int constant), else None."""
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            value = self.constants.get(node.id)
            return value if type(value) is int else None
        return None

    def bool_value(self, node: ast.expr | None) -> bool | None:
        """The value of a literal bool (or a module-level bool constant), else None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and isinstance(self.constants.get(node.id), bool):
            return bool(self.constants[node.id])
        return None

    def workers(self, call: LoaderCall) -> int | None:
        """``num_workers`` of a call: 0 when absent, the int when literal, else None."""
        node = call.args.get("num_workers")
        return 0 if node is None else self.int_value(node)

    def may_have_workers(self, call: LoaderCall) -> bool:
        """True unless ``num_workers`` is known to be 0."""
        return self.workers(call) != 0

    def uses_cpu_count(self, node: ast.expr | None) -> bool:
        """True when the expression calls ``os.cpu_count()`` / ``multiprocessing.cpu_count()``."""
        if node is None:
            return False
        return any(
            isinstance(n, ast.Call) and call_name(n) in _CPU_COUNT_NAMES for n in ast.walk(node)
        )

    def calls(self, name: str) -> list[ast.Call]:
        """Every call of ``name`` (by its final name) in the script."""
        return [
            n
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Call) and call_name(n, self.aliases) == name
        ]

    def reaches_worker_loader(self, func_name: str, _seen: set[str] | None = None) -> bool:
        """True when calling ``func_name`` builds a loader with workers (through local calls)."""
        seen = _seen if _seen is not None else set()
        if func_name in seen or func_name not in self.functions:
            return False
        seen.add(func_name)
        body = self.functions[func_name]
        for node in ast.walk(body):
            if not isinstance(node, ast.Call):
                continue
            loader = next((c for c in self.loaders if c.node is node), None)
            if loader is not None and self.may_have_workers(loader):
                return True
            name = call_name(node)
            if isinstance(node.func, ast.Name) and name and self.reaches_worker_loader(name, seen):
                return True
        return False


def _assigned_names(parents: dict[ast.AST, ast.AST], node: ast.AST) -> set[str]:
    parent = parents.get(node)
    targets: list[ast.expr] = []
    if isinstance(parent, ast.Assign):
        targets = list(parent.targets)
    elif isinstance(parent, (ast.AnnAssign, ast.AugAssign)):
        targets = [parent.target]
    names = set()
    for target in targets:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Attribute):
            names.add(target.attr)
    return names


def _read_source(path: Path) -> str:
    try:
        with tokenize.open(path) as f:  # the encoding its coding line declares (PEP 263)
            return f.read()
    except UnicodeDecodeError as exc:
        raise SyntaxError(f"{path} is not Python source text ({exc})") from exc


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def _imports(tree: ast.AST) -> tuple[dict[str, str], set[str]]:
    """Local names of ``from`` imports -> imported names, and the local names bound to stoker."""
    aliases: dict[str, str] = {}
    stoker_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                local = alias.asname or alias.name
                aliases[local] = alias.name
                if (node.module or "").split(".")[0] == "stoker":
                    stoker_names.add(local)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "stoker":
                    stoker_names.add(alias.asname or alias.name)
    return aliases, stoker_names


def _assignments(
    tree: ast.AST, parents: dict[ast.AST, ast.AST]
) -> tuple[dict[str, object], set[str]]:
    """Module-level constants by name, and the names lambdas are assigned to anywhere."""
    constants: dict[str, object] = {}
    lambda_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                if isinstance(node.value, ast.Constant) and parents.get(node) is tree:
                    constants[target.id] = node.value.value
                if isinstance(node.value, ast.Lambda):
                    lambda_names.add(target.id)
    return constants, lambda_names


def _functions(
    tree: ast.AST, parents: dict[ast.AST, ast.AST]
) -> tuple[dict[str, ast.FunctionDef | ast.AsyncFunctionDef], set[str]]:
    """Functions by name (the first definition), and the names of those defined in another."""
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    nested: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(node.name, node)
            parent = parents.get(node)
            while parent is not None and not isinstance(
                parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ):
                parent = parents.get(parent)
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested.add(node.name)
    return functions, nested


def _start_method(tree: ast.AST, parents: dict[ast.AST, ast.AST]) -> str | None:
    """The start method the script names last (``set_start_method``, ``get_context`` or a
    loader's ``multiprocessing_context=``), or None."""
    start_method = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in ("spawn", "forkserver", "fork"):
            parent = parents.get(node)
            is_ctx_kw = isinstance(parent, ast.keyword) and parent.arg == "multiprocessing_context"
            is_ctx_call = isinstance(parent, ast.Call) and call_name(parent) in (
                "set_start_method",
                "get_context",
            )
            if is_ctx_kw or is_ctx_call:
                start_method = str(node.value)
    return start_method


def _loader_call(script: Script, node: ast.Call) -> LoaderCall:
    args = {kw.arg: kw.value for kw in node.keywords if kw.arg is not None}
    for name, value in zip(LOADER_POSITIONAL, node.args, strict=False):
        args.setdefault(name, value)
    func = node.func
    root = func.value if isinstance(func, ast.Attribute) else func
    while isinstance(root, ast.Attribute):
        root = root.value
    return LoaderCall(
        node=node,
        args=args,
        place=script.place(node),
        names=_assigned_names(script.parents, node),
        from_stoker=isinstance(root, ast.Name) and root.id in script.stoker_names,
    )


def parse_script(path: str | Path) -> Script:
    """Parse a script into a :class:`Script` model.

    Raises:
        OSError: if the file cannot be read.
        SyntaxError: if it is not valid Python.
    """
    path = Path(path)
    source = _read_source(path)
    tree = ast.parse(source, filename=str(path))
    parents = _parents(tree)
    aliases, stoker_names = _imports(tree)
    constants, lambda_names = _assignments(tree, parents)
    functions, nested = _functions(tree, parents)
    script = Script(
        path=path,
        source=source,
        tree=tree,
        parents=parents,
        aliases=aliases,
        stoker_names=stoker_names,
        constants=constants,
        functions=functions,
        nested_functions=nested,
        lambda_names=lambda_names,
        loaders=[],
        start_method=_start_method(tree, parents),
    )
    script.loaders.extend(_loader_call(script, node) for node in script.calls("DataLoader"))
    return script
