"""Carry main-process changes of a dataset's attributes to persistent workers.

The seed articles' pattern is ``loader.dataset.set_epoch(e)`` in the main process between
epochs; torch's persistent workers never see it (they hold a copy made at start). Before each
epoch stoker compares the dataset's attributes with a snapshot (identity for objects, value
for scalars; recursing into nested datasets and samplers) and sends the attributes that were
rebound to every worker. In-place mutation of a mutable attribute (``self.items.append``) is
not seen; ``loader.set_epoch(e)`` additionally calls ``dataset.set_epoch(e)`` in each worker.
"""

from __future__ import annotations

from typing import Any

import torch.utils.data as tud

__all__ = ["AttributeTracker", "apply_changes"]

Path = tuple[str, ...]
_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_MAX_DEPTH = 4


def _recurse_into(value: Any) -> bool:
    return isinstance(value, (tud.Dataset, tud.Sampler)) and hasattr(value, "__dict__")


def _is_scalar(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(isinstance(v, _SCALARS) for v in value)
    return False


class AttributeTracker:
    """Snapshots the attributes of ``root`` and reports the ones rebound since.

    Args:
        root: the dataset (any object with ``__dict__``).
    """

    def __init__(self, root: Any) -> None:
        self._root = root
        self._snap: dict[Path, tuple[bool, Any]] = {}
        self._take(root, (), 0, self._snap, set())

    def _take(
        self, obj: Any, path: Path, depth: int, out: dict[Path, tuple[bool, Any]], seen: set[int]
    ) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        attrs = getattr(obj, "__dict__", None)
        if not isinstance(attrs, dict):
            return
        for name, value in list(attrs.items()):
            key = (*path, name)
            # Scalars compare by value; everything else by identity (the snapshot keeps the
            # object alive, so its id cannot be reused by a new one).
            out[key] = (True, value) if _is_scalar(value) else (False, value)
            if depth + 1 < _MAX_DEPTH and _recurse_into(value):
                self._take(value, key, depth + 1, out, seen)

    def changes(self) -> list[tuple[Path, Any]]:
        """Attributes rebound since the last call, as ``(path, new value)``; outermost first."""
        now: dict[Path, tuple[bool, Any]] = {}
        self._take(self._root, (), 0, now, set())
        changed: list[tuple[Path, Any]] = []
        for key, (scalar, value) in now.items():
            old = self._snap.get(key)
            if old is None:
                changed.append((key, value))
                continue
            old_scalar, old_value = old
            same = (
                (old_value == value and type(old_value) is type(value))
                if scalar and old_scalar
                else old_value is value
            )
            if not same:
                changed.append((key, value))
        self._snap = now
        # A rebound container carries its own new attributes: drop changes beneath it.
        changed.sort(key=lambda kv: len(kv[0]))
        kept: list[tuple[Path, Any]] = []
        for key, value in changed:
            if not any(key[: len(k)] == k for k, _ in kept):
                kept.append((key, value))
        return kept


def apply_changes(root: Any, changes: list[tuple[Path, Any]]) -> None:
    """Rebind each changed attribute of ``root`` (inside a worker)."""
    for path, value in changes:
        obj = root
        for name in path[:-1]:
            obj = getattr(obj, name)
        setattr(obj, path[-1], value)
