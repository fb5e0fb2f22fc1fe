"""Untrusted names reach the terminal as text, never as escape sequences."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stoker._commands.text import printable

CLEAR_AND_TITLE = "\x1b[2J\x1b]0;PWNED\x07"


def test_control_characters_are_written_as_escapes_and_the_rest_is_kept() -> None:
    assert printable(f"a{CLEAR_AND_TITLE}.tar") == "a\\x1b[2J\\x1b]0;PWNED\\x07.tar"
    assert printable("caf\u00e9 \u4e2d\u6587\ttab\nline") == "caf\u00e9 \u4e2d\u6587\ttab\nline"
    assert printable("\x9b31m\x7f\x00") == "\\x9b31m\\x7f\\x00"  # C1 CSI, DEL, NUL


def test_a_shard_named_with_an_escape_sequence_is_named_as_text(tmp_path: Path) -> None:
    """`stoker index` printed the name raw in its error: the terminal cleared and retitled."""
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / f"a{CLEAR_AND_TITLE}.tar").write_bytes(b"not a tar archive" * 64)
    done = subprocess.run(
        [sys.executable, "-m", "stoker", "index", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert "a\\x1b[2J\\x1b]0;PWNED\\x07.tar" in done.stderr
