"""Whether the engine calls a helper of ``stoker._spawn`` yet (end-to-end tests wait for it)."""

from __future__ import annotations

import importlib
import inspect

import pytest


def wired(module: str, helper: str) -> pytest.MarkDecorator:
    """Skip unless ``module``'s source calls ``helper`` (the engine's one-line wiring)."""
    source = inspect.getsource(importlib.import_module(module))
    return pytest.mark.skipif(
        f"{helper}(" not in source, reason=f"{module} does not call {helper}() yet"
    )
