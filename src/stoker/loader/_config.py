"""``stoker.toml``: loader settings found by ``stoker tune``, applied with ``config=``.

::

    [loader]
    backend = "process"
    num_workers = 4
    prefetch_factor = 4
    pin_memory = false

A setting applies to an argument the caller left out; an argument passed wins, whatever its
value. Unknown tables and keys, values of the wrong type, and counts past the caps below (a
typo, or a file tuned on a far larger machine) are errors that name the file, the key, the
value and the cap.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Any

from stoker._introspect.platform import usable_cores
from stoker.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["MAX_PREFETCH_FACTOR", "MAX_WORKERS_PER_CORE", "SETTINGS", "load_config", "write_config"]

SECTION = "loader"
# A stoker.toml is a few hundred bytes; anything past this is not one.
MAX_CONFIG_BYTES = 1024 * 1024
# key -> accepted types (checked in order); "auto" strings are accepted where noted.
SETTINGS: dict[str, tuple[type, ...]] = {
    "backend": (str,),
    "num_workers": (int, str),
    "prefetch_factor": (int, str),
    "pin_memory": (bool,),
    "persistent_workers": (bool,),
    "in_order": (bool,),
}
_STRINGS = {
    "backend": ("process", "thread", "auto"),
    "num_workers": ("auto",),
    "prefetch_factor": ("auto",),
}

#: Most workers a file may ask for, per usable core of the machine that reads it: past that they
#: cannot all run, and each one costs memory and start-up (``stoker tune`` itself stops at 16 x
#: the cores, for threads that mostly wait on I/O).
MAX_WORKERS_PER_CORE = 16
#: Most batches in flight per worker a file may ask for: every one of them is held in memory
#: (shared memory for processes) at once, and ``stoker tune`` tries 2 and 4.
MAX_PREFETCH_FACTOR = 64


def _check_cap(path: Path, key: str, value: Any) -> None:
    """Raise if a count of the file is past its cap on this machine."""
    if not isinstance(value, int) or isinstance(value, bool):
        return
    if key == "num_workers":
        cores = usable_cores()
        cap = MAX_WORKERS_PER_CORE * cores
        if value > cap:
            raise ConfigError(
                f"{path}: `{SECTION}.num_workers = {value}` is more than {cap} "
                f"({MAX_WORKERS_PER_CORE} per usable core x {cores} cores here): past that "
                "workers cannot all run and each costs memory and start-up. Lower it, or write "
                "a file for this machine with `stoker tune module:factory -b BATCH`."
            )
    elif key == "prefetch_factor" and value > MAX_PREFETCH_FACTOR:
        raise ConfigError(
            f"{path}: `{SECTION}.prefetch_factor = {value}` is more than "
            f"{MAX_PREFETCH_FACTOR}: every batch in flight is held in memory at once (workers x "
            "prefetch_factor batches). Lower it (`stoker tune` tries 2 and 4)."
        )


def _read_small_file(p: Path) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_CONFIG_BYTES`: a config from a cloned
    repository may be a link to ``/dev/zero`` (read until memory ran out) or a FIFO (read
    forever)."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without a writer, then fails
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise OSError(errno.EFBIG, f"{info.st_size} bytes, over {MAX_CONFIG_BYTES}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_CONFIG_BYTES + 1)[:MAX_CONFIG_BYTES]
    finally:
        os.close(fd)


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate the ``[loader]`` table of a ``stoker.toml``.

    Raises:
        ConfigError: the file is missing, not TOML, or holds an unknown key, a bad value, or a
            count past its cap (:data:`MAX_WORKERS_PER_CORE` x the usable cores for
            ``num_workers``, :data:`MAX_PREFETCH_FACTOR`).
    """
    p = Path(path)
    try:
        data = tomllib.loads(_read_small_file(p).decode("utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(
            f"`config` file {str(p)!r} does not exist. Create it with `stoker tune "
            "module:factory -b BATCH`, or pass `config=None`."
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, not UTF-8
        raise ConfigError(
            f"`config` file {str(p)!r} cannot be read as TOML text: {exc}. Pass the path of "
            "a `stoker.toml` file (UTF-8), as `stoker tune` writes it."
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"`config` file {str(p)!r} is not valid TOML: {exc}.") from exc
    unknown = sorted(set(data) - {SECTION})
    if unknown:
        raise ConfigError(
            f"{p}: unknown table(s) {', '.join(f'`[{k}]`' for k in unknown)}; the settings "
            f"go in `[{SECTION}]`."
        )
    table = data.get(SECTION, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{p}: `[{SECTION}]` must be a table. Found: {table!r}.")
    out: dict[str, Any] = {}
    for key, value in table.items():
        kinds = SETTINGS.get(key)
        if kinds is None:
            raise ConfigError(
                f"{p}: unknown key `{SECTION}.{key}`; known keys: {', '.join(sorted(SETTINGS))}."
            )
        ok = isinstance(value, kinds) and not (bool in kinds) ^ isinstance(value, bool)
        if isinstance(value, str) and value not in _STRINGS.get(key, ()):
            ok = False
        if isinstance(value, int) and not isinstance(value, bool):
            ok = ok and value >= (1 if key == "prefetch_factor" else 0)
        if not ok:
            allowed = " or ".join(
                [k.__name__ for k in kinds if k is not str]
                + [repr(v) for v in _STRINGS.get(key, ())]
            )
            raise ConfigError(f"{p}: `{SECTION}.{key}` must be {allowed}. Found: {value!r}.")
        _check_cap(p, key, value)
        out[key] = value
    return out


def write_config(path: str | os.PathLike[str], settings: dict[str, Any], comment: str) -> Path:
    """Write ``settings`` as a ``stoker.toml`` with a comment saying how they were found."""
    lines = [f"# {line}" for line in comment.splitlines()] + ["", f"[{SECTION}]"]
    for key in SETTINGS:
        if key in settings:
            value = settings[key]
            text = str(value).lower() if isinstance(value, bool) else repr(value)
            if isinstance(value, str):
                text = f'"{value}"'
            lines.append(f"{key} = {text}")
    p = Path(path)
    p.write_text("\n".join(lines) + "\n")
    return p
