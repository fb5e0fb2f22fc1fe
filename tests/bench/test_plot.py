"""The PNG bar chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.bench._plot import plot
from stoker.bench._result import BenchResult
from stoker.errors import ConfigError

from ._factories import result, workload


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = plot(result(workload("tiny"), workload("jpeg", stoker_error="boom")), tmp_path / "b.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_refuses_an_empty_result(tmp_path: Path) -> None:
    empty = BenchResult(workloads=(), quick=True, repeats=1)
    with pytest.raises(ConfigError, match="nothing to plot"):
        plot(empty, tmp_path / "b.png")
