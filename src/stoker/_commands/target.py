"""The ``module:factory`` a command is pointed at: imported from the current directory, which is
taken off ``sys.path`` again once the module is imported.

``stoker doctor``, ``stoker bench --dataset`` and ``stoker tune`` import their target with the
current directory first on ``sys.path``, as ``python -m`` would. That directory is often a
downloaded dataset: a file there named like a module imported later (``h5py.py``, ``PIL/``,
``rich.py``) must not run in its place, so once the target is imported no ``sys.path`` entry
names the directory. The modules the import brought in from it stay importable by name in spawn
and forkserver workers (which unpickle the dataset by importing its module, with the parent's
``sys.path``) through one stub file each, in a private folder: the stub imports that module from
the directory, with the directory on ``sys.path`` only while it imports, as here.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from stoker.errors import ConfigError

__all__ = ["call_factory", "describe_exception", "import_factory", "importing_from_cwd"]

_STUB = """\
# Written by stoker (stoker._commands.target): {name!r} lives in {folder!r}. Import it from
# there with that folder on sys.path only while it imports, as the process that started this
# one did.
import importlib.util as _util
import sys as _sys
from importlib.machinery import PathFinder as _PathFinder

_folder = {folder!r}
_spec = _PathFinder.find_spec(__name__, [_folder])
if _spec is None:
    raise ImportError(f"{{__name__!r}} is no longer in {{_folder!r}}", name=__name__)
_module = _util.module_from_spec(_spec)
_sys.modules[__name__] = _module
if _spec.loader is not None:
    _sys.path.insert(0, _folder)
    try:
        _spec.loader.exec_module(_module)
    finally:
        _sys.path.remove(_folder)
"""


def _names_folder(entry: str, folder: str) -> bool:
    """Whether the ``sys.path`` entry is ``folder`` (``""`` is the current directory)."""
    return os.path.realpath(entry or os.curdir) == folder


def _lives_in(module: ModuleType | None, name: str, folder: str) -> bool:
    """Whether top-level ``module`` was found in ``folder`` under its own name (``name.py``,
    ``name/``, an extension module), so that a stub can find it there again."""
    spec = getattr(module, "__spec__", None)
    if spec is None:
        return False
    places = list(spec.submodule_search_locations or ())
    if not places and spec.has_location and spec.origin:
        places = [spec.origin]
    for place in places:
        if os.path.basename(place).startswith("__init__."):
            place = os.path.dirname(place)
        stem = os.path.basename(place).split(".", 1)[0]
        if stem == name and os.path.realpath(os.path.dirname(place)) == folder:
            return True
    return False


def _expose(names: list[str], folder: str) -> None:
    """Put a stub per module of ``names`` in a new private folder, first on ``sys.path``."""
    stubs = tempfile.mkdtemp(prefix="stoker-imports-")
    atexit.register(shutil.rmtree, stubs, True)
    for name in names:
        with open(os.path.join(stubs, f"{name}.py"), "w", encoding="utf-8") as handle:
            handle.write(_STUB.format(name=name, folder=folder))
    sys.path.insert(0, stubs)


@contextlib.contextmanager
def importing_from_cwd() -> Iterator[None]:
    """The current directory first on ``sys.path`` inside the block; after it, no entry names
    it, and the top-level modules imported from it in the block stay importable by name."""
    folder = os.path.realpath(os.getcwd())
    before = set(sys.modules)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path[:] = [entry for entry in sys.path if not _names_folder(entry, folder)]
        arrived = sorted(
            name
            for name in set(sys.modules) - before
            if "." not in name and _lives_in(sys.modules.get(name), name, folder)
        )
        if arrived:
            _expose(arrived, folder)


def describe_exception(exc: BaseException) -> str:
    """``ValueError: bad path (at mymod.py:12)``: the exception and the line that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def import_factory(spec: str, option: str) -> Callable[..., Any]:
    """Import ``"module:attribute"`` (dotted attributes allowed) and return the attribute.

    The module is imported, which runs its top-level code, with the current directory first on
    ``sys.path`` (see :func:`importing_from_cwd`).

    Args:
        spec: ``"module:factory"``.
        option: the command-line argument that gave it, for the messages (``"--dataset"``).

    Raises:
        ConfigError: if the spec is malformed, the module cannot be imported (or raises while
            it is), or the attribute is missing or not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"`{option}` must look like `module:factory` (a module importable from the current "
            f"directory or installed, and a function in it). Found: {spec!r}."
        )
    try:
        with importing_from_cwd():
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"`{option} {spec}`: cannot import {module_name!r}: {exc}. Run the command from the "
            "folder that holds it, or install it."
        ) from exc
    except Exception as exc:  # its top-level code raised
        raise ConfigError(
            f"`{option} {spec}`: importing {module_name!r} raised {describe_exception(exc)}."
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"`{option} {spec}`: {module_name!r} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(
            f"`{option} {spec}`: {attr!r} is not callable (found {type(obj).__name__}): name a "
            "function that takes no arguments and returns the dataset."
        )
    return obj


def call_factory(factory: Callable[[], Any], spec: str) -> Any:
    """Call the zero-argument ``factory`` that ``spec`` named; its exception becomes a one-line
    :class:`ConfigError` naming the exception and the line that raised it."""
    try:
        return factory()
    except Exception as exc:
        raise ConfigError(
            f"the factory {spec!r} raised {describe_exception(exc)}. Call it in Python to see "
            "the whole traceback."
        ) from exc
