"""Large Python containers a dataset holds: what every forked worker copies as it reads them
(copy-on-read: reading an object writes its reference count).

Shared by the loader's backend probe (``num_workers="auto"``) and ``stoker doctor`` (SK301).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["MIN_ITEMS", "Container", "find_containers"]

# Containers with fewer items are not worth reporting.
MIN_ITEMS = 1000
# How many items are sized to estimate a container's deep size, and how deep the walk goes.
SIZE_SAMPLE = 256
WALK_DEPTH = 3

_CONTAINERS = (list, tuple, dict, set, frozenset)


@dataclass(frozen=True)
class Container:
    """A large Python container held by the dataset."""

    path: str
    kind: str
    items: int
    bytes: int  # estimated: the container and the objects it holds


def _deep_size(obj: Any, depth: int = 2) -> int:
    size = sys.getsizeof(obj)
    if depth <= 0:
        return size
    if isinstance(obj, dict):
        return size + sum(
            _deep_size(k, depth - 1) + _deep_size(v, depth - 1) for k, v in obj.items()
        )
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(_deep_size(v, depth - 1) for v in obj)
    return size


def _estimate(obj: Any) -> tuple[int, str]:
    n = len(obj)
    items = list(obj.items()) if isinstance(obj, dict) else list(obj) if n <= SIZE_SAMPLE else None
    if items is None:
        seq = obj if isinstance(obj, (list, tuple)) else list(obj)
        step = max(1, n // SIZE_SAMPLE)
        items = [seq[i] for i in range(0, n, step)][:SIZE_SAMPLE]
    per_item = sum(_deep_size(i) for i in items) / max(1, len(items))
    first = items[0] if items else None
    inner = type(first).__name__ if first is not None else "?"
    if isinstance(first, tuple) and len(first) == 2 and isinstance(obj, dict):
        inner = f"{type(first[0]).__name__} -> {type(first[1]).__name__}"
    elif isinstance(first, (tuple, list)):
        inner = f"{inner} of ({', '.join(type(x).__name__ for x in first[:4])})"
    return sys.getsizeof(obj) + int(per_item * n), inner


def find_containers(dataset: Any, path: str = "dataset") -> list[Container]:
    """Large Python containers reachable from the dataset's attributes (largest first)."""
    found: list[Container] = []
    seen: set[int] = set()

    def walk(obj: Any, where: str, depth: int) -> None:
        if id(obj) in seen or depth > WALK_DEPTH:
            return
        seen.add(id(obj))
        if isinstance(obj, _CONTAINERS):
            if len(obj) >= MIN_ITEMS:
                size, inner = _estimate(obj)
                found.append(Container(where, f"{type(obj).__name__} of {inner}", len(obj), size))
                return
            if isinstance(obj, (list, tuple)):
                for i, item in enumerate(obj[:16]):
                    walk(item, f"{where}[{i}]", depth + 1)
            return
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(obj, type) and not callable(obj):
            for key, value in attrs.items():
                walk(value, f"{where}.{key}", depth + 1)
        elif isinstance(attrs, dict) and hasattr(obj, "__getitem__"):
            for key, value in attrs.items():
                walk(value, f"{where}.{key}", depth + 1)

    walk(dataset, path, 0)
    return sorted(found, key=lambda c: -c.bytes)
