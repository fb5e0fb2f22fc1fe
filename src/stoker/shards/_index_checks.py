"""Checks of the values an untrusted ``index.json`` holds: each failure is a
:class:`ShardError` naming the field, the rule and the value found (shortened)."""

from __future__ import annotations

import reprlib
from typing import Any

import numpy as np

from stoker.shards._errors import ShardError

__all__ = ["check_depth", "int_array", "int_in", "invalid", "list_of", "shown"]

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlist = _repr.maxdict = 4
_repr.maxlong = 40


def shown(value: object) -> str:
    """A short repr of an untrusted value."""
    return _repr.repr(value)


def invalid(field: str, value: object, rule: str) -> ShardError:
    return ShardError(f"`{field}` {rule}. Found: {_repr.repr(value)}.")


def int_in(value: object, field: str, lo: int, hi: int, rule: str = "") -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise invalid(field, value, rule or f"must be an integer from {lo} to {hi}")
    return value


_ITEM_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def list_of(value: object, field: str, item: type) -> list[Any]:
    if type(value) is not list:
        raise invalid(field, value, f"must be a list, each item {_ITEM_NAMES[item]}")
    if not set(map(type, value)) <= {item}:
        i = next(i for i, v in enumerate(value) if type(v) is not item)
        raise invalid(f"{field}[{i}]", value[i], f"must be {_ITEM_NAMES[item]}")
    return value


def int_array(value: object, field: str, lo: int, hi: int) -> np.ndarray:
    items = list_of(value, field, int)
    try:
        array = np.array(items, dtype=np.int64)
    except OverflowError:
        i = next(i for i, v in enumerate(items) if not -(1 << 63) <= v < 1 << 63)
        raise invalid(f"{field}[{i}]", items[i], f"must be from {lo} to {hi}") from None
    bad = (array < lo) | (array > hi)
    if bad.any():
        i = int(bad.argmax())
        raise invalid(f"{field}[{i}]", items[i], f"must be from {lo} to {hi}")
    return array


def check_depth(value: object, field: str, limit: int) -> None:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                raise invalid(field, value, f"must not nest deeper than {limit} levels")
            stack += [(v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)]
