"""The finding codes' pages that `stoker doctor --explain` prints: complete, and equal to the
table in doctor/README.md (which is not installed with the package)."""

from __future__ import annotations

import re
from pathlib import Path

from stoker.doctor._codes import CODES, find_page, render_index, render_page

SRC = Path(__file__).resolve().parents[2] / "src" / "stoker"
ROW = re.compile(r"^\| (SK\d{3}) \| (.*?) \| (.*) \| (.*?) \|$", re.M)


def test_pages_equal_the_readme_table() -> None:
    rows = ROW.findall((SRC / "doctor" / "README.md").read_text())
    assert rows == [(p.code, p.severity, p.checks, p.fix) for p in CODES]


def test_every_code_the_doctor_reports_has_a_page() -> None:
    used = {
        code
        for path in SRC.rglob("*.py")
        if path.name != "_codes.py"
        for code in re.findall(r"[\"'](SK\d{3})[\"']", path.read_text())
    }
    assert used and used == {p.code for p in CODES}


def test_find_and_render() -> None:
    page = find_page(" sk012 ")
    assert page is not None and page.code == "SK012"
    assert find_page("SK999") is None
    text = render_page(page)
    assert text.startswith("SK012: static checks") and page.fix in text
    assert "Static checks see one file" in text  # the family's known limit
    assert all(len(line) <= 100 for line in text.splitlines())
    index = render_index()
    assert all(p.code in index for p in CODES)
