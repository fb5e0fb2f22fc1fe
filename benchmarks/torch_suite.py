"""Run torch's own DataLoader test module against torch's loader or stoker's.

Usage::

    python benchmarks/torch_suite.py PATH/TO/test_dataloader.py --loader torch|stoker

The test file (torch's ``test/test_dataloader.py``) is never part of this
repository; pass its path.  It is copied into a temp dir.  For ``--loader
stoker`` two lines are inserted right after the module's ``import operator``
(the end of its import block)::

    from stoker import DataLoader
    torch.utils.data.DataLoader = DataLoader

so both the bare ``DataLoader`` name and ``torch.utils.data.DataLoader``
attribute lookups made by the tests resolve to ``stoker.DataLoader``.  Spawned
worker / helper processes re-import the copied module, so they see the same
swap.  Nothing else is changed.

pytest runs in a subprocess with the running interpreter, with
``--timeout <n>`` per test and ``-k "not cuda and not CUDA"`` (CPU cases; an
extra ``--k-extra`` expression is and-ed in).  ``PYTORCH_TEST_WITH_SLOW`` is
left unset, so ``@slowTest`` cases (test_proper_exit) are reported skipped.
Counts come from ``--junitxml``.  With ``--compare`` both loaders run one
after the other and the tests that pass with torch but not with stoker are
listed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ANCHOR = "import operator\n"
SWAP = "from stoker import DataLoader\ntorch.utils.data.DataLoader = DataLoader\n"


def prepare(src: Path, loader: str, dst_dir: Path) -> Path:
    text = src.read_text()
    if loader == "stoker":
        if ANCHOR not in text:
            raise SystemExit(f"anchor {ANCHOR!r} not found in {src}")
        text = text.replace(ANCHOR, ANCHOR + SWAP, 1)
    dst = dst_dir / "test_dataloader.py"
    dst.write_text(text)
    return dst


def run(src: Path, loader: str, timeout: int, k_extra: str, wall: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"torchsuite-{loader}-"))
    try:
        test = prepare(src, loader, tmp)
        xml = tmp / "junit.xml"
        k = "not cuda and not CUDA"
        if k_extra:
            k = f"({k}) and ({k_extra})"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout",
            str(timeout),
            "-k",
            k,
            f"--junitxml={xml}",
            str(test),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tmp), str(Path(__file__).resolve().parents[1])]
            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        try:
            proc = subprocess.run(
                cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=wall
            )
            tail = proc.stdout[-2000:]
        except subprocess.TimeoutExpired:
            tail = "wall-clock limit reached"
        return summarize(xml, loader, tail)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summarize(xml: Path, loader: str, tail: str) -> dict:
    res: dict[str, Any] = {
        "loader": loader,
        "passed": [],
        "failed": [],
        "skipped": [],
        "errors": [],
    }
    if not xml.exists():
        print(tail)
        return res
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}"
        if case.find("failure") is not None:
            res["failed"].append(name)
        elif case.find("error") is not None:
            res["errors"].append(name)
        elif case.find("skipped") is not None:
            res["skipped"].append(name)
        else:
            res["passed"].append(name)
    return res


def line(res: dict) -> str:
    return (
        f"{res['loader']}: passed={len(res['passed'])} failed={len(res['failed'])} "
        f"skipped={len(res['skipped'])} errors={len(res['errors'])}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("test_file", type=Path)
    ap.add_argument("--loader", choices=["torch", "stoker"], default="stoker")
    ap.add_argument("--compare", action="store_true", help="run torch then stoker")
    ap.add_argument("--timeout", type=int, default=120, help="per-test seconds")
    # A loaded 2-core VM needs more than 25 minutes for one loader's run.
    ap.add_argument("--wall", type=int, default=2400, help="per-run seconds")
    ap.add_argument("--k-extra", default="", help="extra -k expression")
    ap.add_argument("--json", type=Path, help="write per-test results here")
    args = ap.parse_args()
    loaders = ["torch", "stoker"] if args.compare else [args.loader]
    results = {}
    for name in loaders:
        results[name] = run(args.test_file, name, args.timeout, args.k_extra, args.wall)
        print(line(results[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.compare and not all(results[n]["passed"] for n in loaders):
        print("a run has no results (see above): nothing to compare")
    elif args.compare:
        lost = sorted(set(results["torch"]["passed"]) - set(results["stoker"]["passed"]))
        print(f"pass with torch, not with stoker ({len(lost)}):")
        for n in lost:
            print(f"  {n}")


if __name__ == "__main__":
    main()
