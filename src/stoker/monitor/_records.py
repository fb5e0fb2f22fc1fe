"""The records of a ``stoker.watch`` jsonl log read back as untrusted input, field by field.

A log may be damaged, edited, or not a log at all: each field ``stoker report`` uses is checked
for its type and range as its line is read, and a bad one is a :class:`ConfigError` naming the
file, the line, the field and the value (never a ``ValueError`` traceback from deep in the
summary). Strings of a log never reach the output except through ``repr`` in these messages.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any, get_args

from stoker.errors import ConfigError
from stoker.monitor._types import BusySource, LoaderHealth

__all__ = ["LogRecords", "identify"]

_BACKENDS = ("inline", "process", "thread")
_FRACTIONS = ("busy_fraction", "gpu_util")
_COUNTS = (
    "num_workers",
    "outstanding",
    "reorder_depth",
    "slots",
    "slots_in_use",
    "failures",
    "worker_restarts",
    "off_shm_batches",
)
#: Most bytes read to tell what a file that is not a log is (a bench result is a few KiB).
SNIFF_BYTES = 16 << 20


class LogRecords:
    """Typed reads of the records of one file: each error names ``path:line``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.line = 0

    def bad(self, why: str) -> ConfigError:
        """The error for the current line."""
        return ConfigError(f"{self.path}:{self.line}: {why}.")

    def field_error(self, kind: str, key: str, must: str, value: Any) -> ConfigError:
        return self.bad(
            f"the `{kind}` record's `{key}` must be {must}. Found: {value!r}. The log is damaged "
            "or was not written by `stoker.watch`"
        )

    def number(self, rec: dict[str, Any], key: str, *, minimum: float | None = 0.0) -> float:
        """A finite number (``minimum`` or more)."""
        value = rec.get(key)
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (minimum is None or value >= minimum)
        ):
            return float(value)
        must = "a finite number" + (f" >= {minimum:g}" if minimum is not None else "")
        raise self.field_error(rec["kind"], key, must, value)

    def count(
        self, rec: dict[str, Any], key: str, *, minimum: int = 0, optional: bool = False
    ) -> int | None:
        """An int (``minimum`` or more), or ``None`` when ``optional`` and absent or null."""
        value = rec.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            must = f"an int >= {minimum}" + (" or null" if optional else "")
            raise self.field_error(rec["kind"], key, must, value)
        return value

    def loader(self, rec: dict[str, Any]) -> dict[str, Any] | None:
        """The ``loader`` field of an interval: the fields of :class:`LoaderHealth`, checked."""
        raw = rec.get("loader")
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise self.field_error("interval", "loader", "an object or null", raw)
        names = {f.name for f in fields(LoaderHealth)}
        out: dict[str, Any] = {k: v for k, v in raw.items() if k in names}
        sub = {"kind": "interval", **{f"loader.{k}": v for k, v in raw.items()}}
        for key in _COUNTS:
            out[key] = self.count(sub, f"loader.{key}", optional=True)
        for key in _FRACTIONS:
            if raw.get(key) is not None:
                out[key] = self.number(sub, f"loader.{key}")
                if out[key] > 1.0:
                    raise self.field_error("interval", f"loader.{key}", "in [0, 1]", raw[key])
        for key, allowed in (("backend", _BACKENDS), ("busy_source", get_args(BusySource))):
            value = raw.get(key)
            if value is not None and value not in allowed:
                must = " or ".join(map(repr, allowed)) + " or null"
                raise self.field_error("interval", f"loader.{key}", must, value)
        pss = raw.get("pss_bytes") or []
        if not isinstance(pss, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pss
        ):
            raise self.field_error("interval", "loader.pss_bytes", "a list of ints >= 0", pss)
        out["pss_bytes"] = tuple(pss)
        return out


def identify(path: str) -> str | None:
    """What a file that is not a ``stoker.watch`` log is, when it says (``None`` otherwise).

    A ``stoker bench --json`` result or a ``stoker doctor --json`` report is one JSON document
    across many lines: read as a log, its first line ``{`` is not valid JSON.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(SNIFF_BYTES + 1)
        if len(text) > SNIFF_BYTES:
            return None
        doc = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    schema = doc.get("schema")
    if isinstance(schema, str) and schema.startswith("stoker.bench"):
        return f"a `stoker bench` result (schema {schema!r})"
    if isinstance(schema, str):
        return f"a JSON document of schema {schema!r}"
    if "findings" in doc and "target" in doc:
        return "a `stoker doctor --json` report"
    if "cores" in doc and "python" in doc:
        return "a `stoker env --json` report"
    return None
