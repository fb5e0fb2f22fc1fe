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
