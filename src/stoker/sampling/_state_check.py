"""Reading a saved state that may be corrupted or foreign: checks whose errors name the key,
the value found (shortened) and the fix. Shared by the samplers' and the loader's states."""

from __future__ import annotations

import reprlib
from collections.abc import Collection
from typing import Any, NoReturn

from stoker.errors import ConfigError

__all__ = ["COUNT_LIMIT", "StateCheck", "key_path", "shown"]

#: Epochs, lengths and counts beyond any run's reach (and well within the workers' int64
#: status table, whose top values are reserved).
COUNT_LIMIT = 1 << 48


class _Short(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = 6
        self.maxstring = self.maxother = self.maxlong = 60

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 64:  # repr() of a huge int is slow, or refused (str digits limit)
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHORT = _Short()


def shown(value: Any) -> str:
    """A short repr of an untrusted value (a huge int, a deep structure, a failing repr)."""
    try:
        return _SHORT.repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _number(n: int) -> str:
    """``n``, with the limits above 2**32 written as powers of two."""
    if n >= 1 << 32:
        if n & (n - 1) == 0:
            return f"2**{n.bit_length() - 1}"
        if (n + 1) & n == 0:
            return f"2**{n.bit_length()} - 1"
    return str(n)


def key_path(*keys: str) -> str:
    """``['a']['b']``: where a value sits in a saved state, for messages."""
    return "".join(f"[{k!r}]" for k in keys)


class StateCheck:
    """Reads a saved state that may be corrupted or foreign (no I/O, nothing changed).

    Every problem is a ``ConfigError`` that names the key (``name['key']``), the value found
    (truncated) and ``fix``.
    """

    def __init__(self, name: str, fix: str) -> None:
        self.name = name
        self.fix = fix

    def fail(self, path: str, found: Any, need: str) -> NoReturn:
        raise ConfigError(f"`{self.name}{path}` must be {need}. Found: {shown(found)}. {self.fix}")

    def mapping(
        self,
        state: Any,
        path: str,
        known: Collection[str],
        required: Collection[str],
        writer: str,
    ) -> dict[Any, Any]:
        """``state`` itself, once it is a dict with only ``known`` keys and every ``required``
        one."""
        if not isinstance(state, dict):
            self.fail(path, state, f"a dictionary returned by `{writer}`")
        unknown = [k for k in state if k not in known]
        if unknown:
            raise ConfigError(
                f"`{self.name}{path}` has keys that `{writer}` does not write: {shown(unknown)}. "
                f"{self.fix}"
            )
        missing = [k for k in required if k not in state]
        if missing:
            raise ConfigError(
                f"`{self.name}{path}` lacks the keys {missing} that `{writer}` writes. {self.fix}"
            )
        return state

    def integer(self, value: Any, path: str, low: int, high: int, why: str = "") -> int:
        """``value`` if it is an int (not a bool) in ``[low, high]``; ``why`` explains the
        bounds in the message."""
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            self.fail(path, value, f"an int in [{_number(low)}, {_number(high)}]{why}")
        return int(value)

    def flag(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, value, "True or False")
        return value
