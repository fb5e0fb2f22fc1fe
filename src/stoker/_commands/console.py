"""Rich consoles for the ``stoker`` commands: a terminal's width on a terminal; elsewhere (a
pipe, a file) lines as long as their content, never wrapped at a width nobody chose."""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING, cast

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["PIPE_WIDTH", "console"]

#: Columns rich lays output out in when it is not a terminal. Rich needs a width; this one is
#: wider than any line stoker prints, so nothing wraps, and the padding rich adds up to it
#: is stripped from each line as it is written.
PIPE_WIDTH = 10_000


class _StripTrailing:
    """A text stream that drops the spaces rich pads each line with up to the width."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        lines = text.split("\n")
        self._stream.write("\n".join(line.rstrip(" ") for line in lines))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._stream.fileno()


def console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console for a command's output on stdout (or stderr).

    On a terminal it has the terminal's width. Elsewhere lines are not wrapped (the
    ``COLUMNS`` environment variable, when set, is the width), unless ``width`` is given.

    Args:
        stderr: write to standard error instead of standard output. Default ``False``.
        width: the width when the output is not a terminal, for output laid out as a
            fixed-width table. Default: no wrapping.
    """
    from rich.console import Console

    out = Console(stderr=stderr)
    if out.is_terminal:
        return out
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return Console(stderr=stderr, width=int(columns))
    if width is not None:
        return Console(stderr=stderr, width=width)
    stream = sys.stderr if stderr else sys.stdout
    # cast: rich asks for IO[str] and calls only write, flush, isatty and fileno
    return Console(file=cast("IO[str]", _StripTrailing(stream)), width=PIPE_WIDTH)
