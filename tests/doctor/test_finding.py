"""Finding and Diagnosis: validation, ordering, exit status, JSON."""

from __future__ import annotations

import json

import pytest

from stoker.doctor import Diagnosis, Finding, Severity
from stoker.errors import ConfigError


def _finding(code: str = "SK001", severity: str = "error", location: str | None = None) -> Finding:
    return Finding(code, severity, "title", "observed 3", "why", "fix()", location)  # type: ignore[arg-type]


def test_finding_validates_code_severity_and_texts() -> None:
    with pytest.raises(ConfigError, match="SK012"):
        _finding(code="E12")
    with pytest.raises(ConfigError, match="'fatal'"):
        _finding(severity="fatal")
    with pytest.raises(ConfigError, match="`fix`"):
        Finding("SK001", Severity.ERROR, "t", "o", "w", "  ")
    assert _finding(severity="warning").severity is Severity.WARNING


def test_diagnosis_orders_worst_first_and_sets_exit_status() -> None:
    d = Diagnosis("x", (_finding("SK301", "info"), _finding("SK202", "warning")))
    assert d.codes == ["SK202", "SK301"]
    assert d.exit_status() == 0
    assert d.exit_status(strict=True) == 1
    d2 = Diagnosis("x", (_finding("SK301", "info"), _finding("SK101", "error")))
    assert d2.codes == ["SK101", "SK301"]
    assert d2.exit_status() == 1
    assert Diagnosis("x").exit_status(strict=True) == 0


def test_diagnosis_to_dict_is_json_with_counts() -> None:
    d = Diagnosis("t.py", (_finding(location="t.py:3"),), facts={"usable_cores": 2})
    data = json.loads(json.dumps(d.to_dict()))
    assert data["summary"] == {"error": 1, "warning": 0, "info": 0}
    assert data["findings"][0]["location"] == "t.py:3"
    assert data["facts"] == {"usable_cores": 2}
    assert len(d) == 1 and [f.code for f in d] == ["SK001"]
