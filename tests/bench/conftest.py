"""Fixtures for the bench tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _warm_matplotlib_fonts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """matplotlib keeps its font files open in a process-wide cache once it first draws text.

    Draw once before any test so that the leak fixture does not count that cache.
    """
    from stoker.bench._plot import plot

    from ._factories import result

    plot(result(), Path(tmp_path_factory.mktemp("fonts")) / "warm.png")
    yield
