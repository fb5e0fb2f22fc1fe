"""Every Python example in the README runs, as a script, in a fresh interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    script = tmp_path / f"example_{index}.py"
    script.write_text(BLOCKS[index])
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert proc.returncode == 0, f"README example {index} failed:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr


def test_readme_commands_match_ci():
    ci = (README.parent / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", README.read_text(), flags=re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command.strip() in ci
