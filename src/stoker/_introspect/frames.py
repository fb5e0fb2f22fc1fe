"""Where user code called into stoker: the frame a warning should name."""

from __future__ import annotations

import os
import sys
from types import FrameType

import torch.utils.data

__all__ = ["user_stacklevel"]

# Frames in these folders are stoker's or torch's loader machinery, never the user's code.
_INTERNAL = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(torch.utils.data.__file__)) + os.sep,
)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller name the first frame
    outside stoker and torch's ``torch.utils.data`` (the user's loop, not ``_iterator.py``)."""
    frame: FrameType | None = sys._getframe(1)  # the function that will call warnings.warn
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back
        level += 1
    return level
