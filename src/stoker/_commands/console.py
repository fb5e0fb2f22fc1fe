"""Rich consoles for the ``stoker`` commands: a terminal's width on a terminal, and a wide fixed
width elsewhere, rather than rich's 80 columns."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["PIPE_WIDTH", "console"]

#: Columns of the output when it is not a terminal (a pipe, a file): rich needs a width to lay
#: out tables and indented blocks, and its default of 80 wraps (or crops) most of our lines; the
#: rows of every stoker table fit in this.
PIPE_WIDTH = 150


def console(*, stderr: bool = False, width: int = PIPE_WIDTH) -> Console:
    """A console for a command's output on stdout (or stderr).

    On a terminal it has the terminal's width. Elsewhere it has ``width`` columns, unless the
    ``COLUMNS`` environment variable says otherwise.

    Args:
        stderr: write to standard error instead of standard output. Default ``False``.
        width: the width when the output is not a terminal. Default :data:`PIPE_WIDTH`.
    """
    from rich.console import Console

    out = Console(stderr=stderr)
    if out.is_terminal:
        return out
    columns = os.environ.get("COLUMNS", "")
    return Console(stderr=stderr, width=int(columns) if columns.isdigit() else width)
