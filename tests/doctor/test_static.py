"""Static checks SK001-SK012: each fires on a crafted script and stays silent on its fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from stoker.doctor import Severity, diagnose_script

HEADER = """\
import os
import torch
from torch.utils.data import DataLoader, TensorDataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler
ds = None
"""


def codes(tmp_path: Path, body: str, *, cores: int = 8) -> list[str]:
    path = tmp_path / "train.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return diagnose_script(path, usable_cores=cores).codes


def guarded(body: str) -> str:
    return (
        "def main():\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
        + ('\n\nif __name__ == "__main__":\n    main()\n')
    )


CASES = {
    # code: (bad script, good script)
    "SK001": (
        "def main():\n    loader = DataLoader(ds, num_workers=2)\n    for b in loader:\n"
        "        pass\n\nmain()\n",
        guarded("loader = DataLoader(ds, num_workers=2)\nfor b in loader:\n    pass"),
    ),
    "SK002": (
        "loader = DataLoader(ds, num_workers=2)\n\ndef main():\n    for b in loader:\n"
        '        pass\n\nif __name__ == "__main__":\n    main()\n',
        "loader = DataLoader(ds, num_workers=0)\n\ndef main():\n    for b in loader:\n"
        '        pass\n\nif __name__ == "__main__":\n    main()\n',
    ),
    "SK003": (
        guarded("d = Dataset(transform=lambda x: x)\nDataLoader(d, num_workers=2)"),
        "def to_float(x):\n    return x\n\n"
        + guarded("d = Dataset(transform=to_float)\nDataLoader(d, num_workers=2)"),
    ),
    "SK004": (
        guarded("DataLoader(ds, persistent_workers=True)"),
        guarded("DataLoader(ds, num_workers=2, persistent_workers=True)"),
    ),
    "SK005": (
        guarded("DataLoader(ds, num_workers=0, prefetch_factor=2)"),
        guarded("DataLoader(ds, num_workers=2, prefetch_factor=2)"),
    ),
    "SK006": (
        guarded("loader = DataLoader(ds, pin_memory=True)\nfor x in loader:\n    x.to('cuda')"),
        guarded(
            "loader = DataLoader(ds, pin_memory=True)\nfor x in loader:\n"
            "    x.to('cuda', non_blocking=True)"
        ),
    ),
    "SK007": (
        guarded("loader = DataLoader(ds)\nfor x in loader:\n    x.cuda(non_blocking=True)"),
        guarded(
            "loader = DataLoader(ds, pin_memory=True)\nfor x in loader:\n"
            "    x.cuda(non_blocking=True)"
        ),
    ),
    "SK008": (
        guarded("DataLoader(ds, num_workers=os.cpu_count() - 1)"),
        guarded("DataLoader(ds, num_workers=len(os.sched_getaffinity(0)) - 1)"),
    ),
    "SK009": (
        "W = 16\n" + guarded("DataLoader(ds, num_workers=W)"),
        "W = 4\n" + guarded("DataLoader(ds, num_workers=W)"),
    ),
    "SK010": (
        guarded(
            "for epoch in range(3):\n    for b in DataLoader(ds, num_workers=2):\n"
            "        pass\n    loader = DataLoader(ds, num_workers=2)"
        ),
        guarded(
            "loader = DataLoader(ds, num_workers=2)\nfor epoch in range(3):\n"
            "    for b in loader:\n        pass"
        ),
    ),
    "SK011": (
        guarded(
            "s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s)\n"
            "for e in range(2):\n    for b in loader:\n        pass"
        ),
        guarded(
            "s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s)\n"
            "for e in range(2):\n    s.set_epoch(e)\n    for b in loader:\n        pass"
        ),
    ),
    "SK012": (
        guarded("DataLoader(ds, shuffle=True, sampler=RandomSampler(ds))"),
        guarded("DataLoader(ds, shuffle=False, sampler=RandomSampler(ds))"),
    ),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_check_fires_on_bad_and_not_on_good(tmp_path: Path, code: str) -> None:
    bad, good = CASES[code]
    found = codes(tmp_path, bad)
    assert found and set(found) == {code}
    assert code not in codes(tmp_path, good)
    assert codes(tmp_path, good) == []


def test_findings_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_text(HEADER + guarded("DataLoader(ds, prefetch_factor=2)"))
    (finding,) = diagnose_script(path, usable_cores=4).findings
    line = HEADER.count("\n") + 2
    assert finding.location == f"{path}:{line}"
    assert f"line {line}" in finding.observed


def test_module_level_iteration_is_one_error_not_two(tmp_path: Path) -> None:
    body = "loader = DataLoader(ds, num_workers=2)\nfor b in loader:\n    pass\n"
    assert codes(tmp_path, body) == ["SK001"]


def test_lambda_is_an_error_when_the_script_selects_spawn(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_text(
        HEADER
        + guarded(
            "DataLoader(ds, num_workers=2, collate_fn=lambda b: b, multiprocessing_context='spawn')"
        )
    )
    (finding,) = diagnose_script(path, usable_cores=4).findings
    assert finding.code == "SK003" and finding.severity is Severity.ERROR
    assert "'spawn'" in finding.why


def test_nested_function_and_lambda_attribute_are_found(tmp_path: Path) -> None:
    body = "class D:\n    def __init__(self):\n        self.t = lambda x: x\n\n" + guarded(
        "def init(i):\n    pass\nDataLoader(D(), num_workers=2, worker_init_fn=init)"
    )
    found = diagnose_script_body(tmp_path, body)
    assert [f.code for f in found] == ["SK003", "SK003"]
    assert any("self.t" in f.title for f in found)
    assert any("`init`" in f.observed for f in found)


def diagnose_script_body(tmp_path: Path, body: str) -> list:
    path = tmp_path / "t.py"
    path.write_text(HEADER + body)
    return list(diagnose_script(path, usable_cores=4).findings)


def test_unparseable_script_raises_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text("def (:\n")
    with pytest.raises(SyntaxError):
        diagnose_script(path)
