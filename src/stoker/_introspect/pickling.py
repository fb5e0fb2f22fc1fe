"""Which part of an object fails to pickle, and how stoker pickles for spawn workers.

Shared by the loader (the error for an unpicklable dataset) and ``stoker doctor`` (SK101).
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Dumps", "cloud_dumps", "describe_object", "locate_unpicklable", "std_dumps"]

# How deep the search for the offending attribute goes, and how many items of a container it
# tries (the culprit is usually in every item, or in the first few).
SEARCH_DEPTH = 6
SEARCH_ITEMS = 32
Dumps = Callable[[Any], bytes]


def _persistent_id(obj: Any) -> str | None:
    # Tensors reach workers through shared memory, not the pickle stream (torch's reducers move
    # them there, a side effect we must not have on the user's dataset): leave them out.
    import torch

    if (isinstance(obj, torch.Tensor) and not obj.requires_grad) or isinstance(
        obj, (torch.UntypedStorage, torch.TypedStorage)
    ):
        return "tensor"
    return None


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> str | None:
        return _persistent_id(obj)


def std_dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def cloud_dumps(obj: Any) -> bytes:
    """``obj`` pickled as stoker sends it to spawn/forkserver workers (tensors left out)."""
    import cloudpickle

    class _CloudPickler(cloudpickle.CloudPickler):
        def persistent_id(self, obj: Any) -> str | None:
            return _persistent_id(obj)

    buf = io.BytesIO()
    _CloudPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _function_parts(fn: Any, path: str) -> Iterator[tuple[str, Any]]:
    """What cloudpickle stores with a function it pickles by value: closure cells, globals."""
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        with contextlib.suppress(ValueError):  # an empty cell
            yield f"{path}.<closure {name}>", cell.cell_contents
    fn_globals = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in fn_globals and not isinstance(fn_globals[name], types.ModuleType):
            yield f"{path}.<global {name}>", fn_globals[name]


def _children(obj: Any, path: str, into_functions: bool) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for i, (key, value) in enumerate(obj.items()):
            if i >= SEARCH_ITEMS:
                return
            yield f"{path}[{key!r}]", value
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj[:SEARCH_ITEMS]):
            yield f"{path}[{i}]", value
    elif isinstance(obj, (set, frozenset)):
        for i, value in enumerate(obj):
            if i >= SEARCH_ITEMS:
                return
            yield f"{path}{{item {i}}}", value
    elif isinstance(obj, functools.partial):
        yield f"{path}.func", obj.func
        for i, value in enumerate(obj.args):
            yield f"{path}.args[{i}]", value
        for key, value in obj.keywords.items():
            yield f"{path}.keywords[{key!r}]", value
    elif isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
        owner = obj.__self__
        if owner is not None and not isinstance(owner, types.ModuleType):
            yield f"{path}.__self__", owner
        if isinstance(obj, types.MethodType):
            yield f"{path}.__func__", obj.__func__
    elif callable(obj) and hasattr(obj, "__code__"):
        # pickle stores a function by name: its closure is reported as the function itself;
        # cloudpickle stores a lambda/local function by value, closure and globals included
        if into_functions:
            yield from _function_parts(obj, path)
    else:
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            for key, value in attrs.items():
                yield f"{path}.{key}", value
        for slot in getattr(type(obj), "__slots__", ()) or ():
            if isinstance(slot, str) and hasattr(obj, slot):
                yield f"{path}.{slot}", getattr(obj, slot)


def _fails(obj: Any, dumps: Dumps) -> BaseException | None:
    try:
        dumps(obj)
    except Exception as exc:  # any failure is what we report (incl. RecursionError)
        return exc
    return None


def locate_unpicklable(
    obj: Any,
    path: str,
    dumps: Dumps = std_dumps,
    _depth: int = 0,
    *,
    into_functions: bool | None = None,
) -> tuple[str, Any, BaseException] | None:
    """The deepest part of ``obj`` that fails to pickle, as (attribute path, object, error).

    Args:
        obj: the object to pickle.
        path: its name, the start of every reported path (``"dataset"``).
        dumps: the pickler: the standard one (default, as torch) or :func:`cloud_dumps`.
        into_functions: also search a failing function's closure and globals (what cloudpickle
            stores by value). Default: only when ``dumps`` is :func:`cloud_dumps`.

    Returns:
        ``(path, object, error)``, e.g. ``("dataset.transform.steps[2].handle", <file>,
        TypeError(...))``, or None when ``obj`` pickles.
    """
    if into_functions is None:
        into_functions = dumps is cloud_dumps
    error = _fails(obj, dumps)
    if error is None:
        return None
    if _depth < SEARCH_DEPTH:
        for child_path, child in _children(obj, path, into_functions):
            found = locate_unpicklable(
                child, child_path, dumps, _depth + 1, into_functions=into_functions
            )
            if found is not None:
                return found
    return path, obj, error


def describe_object(obj: Any) -> str:
    """What ``obj`` is, for a message: a lambda/function with its definition line, or a type."""
    code = getattr(obj, "__code__", None)
    if code is not None:
        qualname = getattr(obj, "__qualname__", getattr(obj, "__name__", "?"))
        kind = "a lambda" if "<lambda>" in qualname else "a function"
        if "<locals>" in qualname:
            kind = f"{kind} defined inside another function"
        return f"{kind} `{qualname}` (defined at {code.co_filename}:{code.co_firstlineno})"
    return f"a `{type(obj).__module__}.{type(obj).__qualname__}` object"
