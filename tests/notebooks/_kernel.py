"""Execute a notebook on a real ipykernel running this interpreter (the project's venv).

A kernelspec pointing at ``sys.executable`` is written to a temporary ``JUPYTER_PATH``, so the
kernel imports the same stoker and torch as the tests, whatever kernels the machine has.
Jupyter's and IPython's runtime and profile directories are temporary too.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

KERNEL_NAME = "stoker-tests-venv"
# Seconds a cell may run (spawn workers import torch), and the kernel may take to start.
CELL_TIMEOUT_S = 240
STARTUP_TIMEOUT_S = 120
NOTEBOOKS = Path(__file__).parent


def install_kernel(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write a kernelspec running ``sys.executable`` and point Jupyter at temporary dirs."""
    spec_dir = root / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "stoker tests (venv)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(root / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(root / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("IPYTHONDIR", str(root / "ipython"))


def load(name: str, **parameters: str) -> Any:
    """Read a notebook of this directory and set its ``parameters`` cell's variables."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{name} needs exactly one cell tagged 'parameters'"
    cells[0].source = "\n".join(f"{key} = {value!r}" for key, value in parameters.items())
    return nb


def execute(nb: Any, workdir: Path, *, allow_errors: bool = False) -> Any:
    """Run every cell on the venv kernel (cwd ``workdir``); the executed notebook is kept there.

    Runs on a private event loop (``asyncio.run``), closed afterwards, so that no loop or
    socket outlives the call.
    """
    client = NotebookClient(
        nb,
        kernel_name=KERNEL_NAME,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=STARTUP_TIMEOUT_S,
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(workdir)}},
    )
    try:
        asyncio.run(client.async_execute())
    finally:
        nbformat.write(nb, workdir / "executed.ipynb")
    return nb


def text_of(cell: Any) -> str:
    """Everything a code cell showed: streams, plain-text displays and results, errors."""
    parts: list[str] = []
    for out in cell.get("outputs", []):
        kind = out["output_type"]
        if kind == "stream":
            parts.append(out["text"])
        elif kind in ("display_data", "execute_result"):
            parts.append(out["data"].get("text/plain", ""))
        elif kind == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
    return "".join(parts)


def error_of(cell: Any) -> dict[str, Any] | None:
    """The cell's error output (``ename``, ``evalue``, ``traceback``), or None."""
    for out in cell.get("outputs", []):
        if out["output_type"] == "error":
            return dict(out)
    return None
