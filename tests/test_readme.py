"""The README's set-up agrees with CI and with the commands after it.

Its examples are run, with those of docs/, by tests/test_docs.py.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
COMMANDS = re.findall(r"```bash\n(.*?)\n```", README.read_text(), flags=re.S)


def test_readme_commands_match_ci() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = next(c for c in COMMANDS if "pytest" in c)
    assert test_command.strip() in ci


def test_the_venv_is_activated_before_bare_commands() -> None:
    """Later commands say `stoker` and `torchrun`, found only once .venv is on PATH."""
    assert "source .venv/bin/activate" in COMMANDS
    setup = [c for c in COMMANDS if "pip install" in c]
    assert len(setup) == 2 and all(".venv/bin/" in c for c in setup)
