"""`stoker doctor` on examples/doctor finds exactly the planted traps, nothing in clean ones.

Each example states what the doctor must report in a line `doctor: expect SK0xx` (or
`expect nothing`): in the module docstring for scripts, in the factory's docstring for the
live loaders in live_loaders.py.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

from stoker.doctor import diagnose, diagnose_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "doctor"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if p.name != "live_loaders.py")
_EXPECT = re.compile(r"doctor: expect (nothing|(?:SK\d{3}(?:, )?)+)")


def expected(doc: str | None) -> list[str]:
    match = _EXPECT.search(doc or "")
    assert match, "example has no `doctor: expect ...` line"
    return [] if match.group(1) == "nothing" else sorted(match.group(1).split(", "))


def test_there_is_a_clean_script_and_a_trap_per_static_code() -> None:
    planted = {c for p in SCRIPTS for c in expected(p.read_text())}
    assert planted == {f"SK{n:03d}" for n in range(1, 13)}
    assert any(expected(p.read_text()) == [] for p in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_static_example(script: Path) -> None:
    diagnosis = diagnose_script(script, usable_cores=8)
    assert sorted(diagnosis.codes) == expected(script.read_text())


def _live_module():
    spec = importlib.util.spec_from_file_location(
        "_doctor_live_loaders", EXAMPLES / "live_loaders.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


LIVE = _live_module()
FACTORIES = [
    name
    for name, obj in vars(LIVE).items()
    if callable(obj)
    and getattr(obj, "__module__", "") == LIVE.__name__
    and "doctor: expect" in (obj.__doc__ or "")
]


def test_live_examples_cover_clean_and_traps() -> None:
    assert "clean" in FACTORIES and len(FACTORIES) >= 6


@pytest.mark.parametrize("name", FACTORIES)
def test_live_example(name: str) -> None:
    factory = getattr(LIVE, name)
    loader = factory()
    try:
        diagnosis = diagnose(loader)
        assert sorted(set(diagnosis.codes)) == expected(factory.__doc__), diagnosis.to_dict()
    finally:
        handle = getattr(loader.dataset, "file", None)
        if handle is not None:
            path = Path(handle.filename)
            handle.close()
            shutil.rmtree(path.parent)
