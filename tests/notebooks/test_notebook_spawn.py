"""A real notebook on a real kernel: spawn and forkserver workers with notebook-defined code.

``spawn_lambda.ipynb`` defines a Dataset class and a lambda transform in the notebook (in
``__main__``), loads one epoch with ``num_workers=2`` under spawn and under forkserver, and a
third epoch through ``stoker.watch``. With stoker every cell passes with correct values; with
torch's DataLoader the same cells fail with the pickling error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ._kernel import error_of, execute, install_kernel, load, text_of

NOTEBOOK = "spawn_lambda.ipynb"

pytestmark = pytest.mark.slow


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install_kernel(tmp_path, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    return work


def _cell(nb, marker: str):
    matches = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    assert len(matches) == 1, marker
    return matches[0]


def test_stoker_loads_notebook_code_under_spawn_and_forkserver(workdir: Path) -> None:
    nb = execute(load(NOTEBOOK, LOADER="stoker"), workdir)

    setup = text_of(_cell(nb, 'print("python:"'))
    assert f"python: {sys.executable}" in setup  # the kernel runs the venv's interpreter
    assert "loader: stoker.loader._loader" in setup
    for method in ("spawn", "forkserver"):
        out = text_of(_cell(nb, f'multiprocessing_context="{method}"'))
        assert f"{method}: 24 samples correct, loaded by worker pids" in out, out
    watched = _cell(nb, "watch(spawn_loader")
    out = text_of(watched)
    assert "watched epoch: 24 samples correct" in out, out
    # the progress display rendered through rich's Jupyter support: rich HTML + plain text
    shown = [o for o in watched.outputs if o.output_type == "display_data"]
    assert shown, watched.outputs
    html = "".join(o.data.get("text/html", "") for o in shown)
    plain = "".join(o.data.get("text/plain", "") for o in shown)
    assert "[stoker.watch] step 2/6" in plain and "[stoker.watch] step 6/6" in plain, plain
    assert "[stoker.watch] done: 6 steps" in plain and "samples/s" in plain, plain
    assert "<pre" in html and "stoker.watch" in html, html
    assert all(error_of(c) is None for c in nb.cells if c.cell_type == "code")


def test_torch_fails_the_same_cells_with_a_pickling_error(workdir: Path) -> None:
    nb = execute(load(NOTEBOOK, LOADER="torch"), workdir, allow_errors=True)

    assert "loader: torch.utils.data.dataloader" in text_of(_cell(nb, 'print("python:"'))
    assert error_of(_cell(nb, "class Squares")) is None  # defining it is fine
    for method in ("spawn", "forkserver"):
        error = error_of(_cell(nb, f'multiprocessing_context="{method}"'))
        assert error is not None, method
        message = f"{error['ename']}: {error['evalue']}"
        assert "Can't pickle" in message and "<lambda>" in message, message
        assert "samples correct" not in text_of(_cell(nb, f'multiprocessing_context="{method}"'))
