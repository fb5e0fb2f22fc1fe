"""`stoker doctor` and `stoker env` on the command line: output, JSON, exit status."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stoker import cli
from stoker.doctor import _env_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "doctor"
ROOT = EXAMPLES.parents[1]


def run_doctor(*argv: str) -> int:
    """`stoker doctor ARGV` in this process, through the command's entry point (which turns a
    usage error into status 2 and one line on stderr)."""
    return cli.main(["doctor", *argv])


def test_rows_are_registered() -> None:
    assert cli._COMMANDS["doctor"][0] == "stoker.doctor._cli"
    assert cli._COMMANDS["env"][0] == "stoker.doctor._env_cli"


def test_script_json_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_doctor(str(EXAMPLES / "trap_persistent_no_workers.py"), "--json") == 1
    data = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in data["findings"]] == ["SK004"]
    assert data["summary"]["error"] == 1
    # A warning passes unless --strict.
    warn = str(EXAMPLES / "trap_loader_in_epoch_loop.py")
    assert run_doctor(warn, "--json") == 0
    assert run_doctor(warn, "--json", "--strict") == 1
    assert run_doctor(str(EXAMPLES / "clean_train.py"), "--json", "--strict") == 0


def test_rich_output_shows_code_observed_why_fix(capsys: pytest.CaptureFixture[str]) -> None:
    run_doctor(str(EXAMPLES / "trap_lambda_transform.py"))
    out = capsys.readouterr().out
    for text in (
        "SK003 error",
        "observed",
        "why",
        "fix",
        "trap_lambda_transform.py:24",
        "def to_float(x):",
        "1 error(s), 0 warning(s)",
    ):
        assert text in out


def test_factory_target(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"{EXAMPLES / 'live_loaders.py'}:lambda_transform_spawn"
    assert run_doctor(target, "--json") == 1
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == target
    assert [f["code"] for f in data["findings"]] == ["SK101"]
    assert data["findings"][0]["location"] == "loader.dataset.transform"
    assert run_doctor(f"{EXAMPLES / 'live_loaders.py'}:clean", "--strict") == 0


def test_bad_targets_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_doctor(str(tmp_path / "missing.py")) == 2
    assert run_doctor("no_such_module_xyz:make") == 2
    assert "cannot import 'no_such_module_xyz'" in capsys.readouterr().err
    assert run_doctor(f"{EXAMPLES / 'live_loaders.py'}:nope") == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err
    bad = tmp_path / "f.py"
    bad.write_text("def make():\n    raise OSError('disk gone')\n")
    assert run_doctor(f"{bad}:make") == 2
    assert "raised OSError: disk gone" in capsys.readouterr().err
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert run_doctor(str(binary)) == 2  # not a traceback
    assert "blob.py" in capsys.readouterr().err


def test_a_script_in_the_encoding_its_coding_line_declares_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "latin.py"
    script.write_bytes("# -*- coding: latin-1 -*-\nname = 'caf\u00e9'\n".encode("latin-1"))
    assert run_doctor(str(script)) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_module_factory_from_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mydata_doctor_test.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "def make():\n    return DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert run_doctor("mydata_doctor_test:make", "--json") == 0
    finally:
        sys.modules.pop("mydata_doctor_test", None)
    assert json.loads(capsys.readouterr().out)["facts"]["batch_size"] == 4


def test_env_json_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    _env_cli.configure(parser)
    out = tmp_path / "environment.yml"
    args = parser.parse_args(["--json", "--data-dir", str(tmp_path), "--export", str(out)])
    assert _env_cli.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["export"]["how"] == "pip pins" and out.exists()
    assert data["data_dir"]["kind"] in ("local", "memory", "network")
    assert _env_cli.run(parser.parse_args([])) == 0
    text = capsys.readouterr().out
    for key in ("torch", "usable", "shared memory", "open files", "start method", "environment"):
        assert key in text


def console_script() -> Path:
    """The `stoker` console script that the dev set-up (`pip install -e ".[dev]"`) installs
    next to this interpreter; its absence is a packaging failure, not a reason to skip."""
    script = Path(sys.executable).parent / "stoker"
    assert script.is_file(), f"no `stoker` console script beside {sys.executable}"
    return script


def test_console_script_end_to_end() -> None:
    # The installed `stoker doctor` process, as a user or CI would run it.
    env = dict(os.environ, COLUMNS="120")
    done = subprocess.run(
        [str(console_script()), "doctor", str(EXAMPLES / "trap_shuffle_with_sampler.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    assert "SK012" in done.stdout
    assert "stoker doctor --explain SK012" in done.stdout  # the footer names the command


def run_script(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed `stoker ARGV`, with a wide terminal."""
    env = dict(os.environ, COLUMNS="120")
    return subprocess.run(
        [str(console_script()), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


def test_explain_prints_a_codes_page_from_the_installed_package() -> None:
    from stoker.doctor._codes import CODES, find_page

    page = find_page("SK012")
    assert page is not None
    done = run_script("doctor", "--explain", "sk012")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("SK012: ") and "`batch_sampler=`" in done.stdout
    assert page.fix in done.stdout and not done.stderr
    listed = run_script("doctor", "--explain", "all")
    assert listed.returncode == 0, listed.stderr
    assert re.findall(r"^  (SK\d{3}) ", listed.stdout, re.M) == [p.code for p in CODES]


def test_explain_an_unknown_code_is_a_usage_error() -> None:
    done = run_script("doctor", "--explain", "SK999")
    assert done.returncode == cli.USAGE_ERROR and not done.stdout
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    assert "'SK999'" in errors[0] and "stoker doctor --explain all" in errors[0]
    assert "Traceback" not in done.stderr
    # Neither a target nor a code, or both: usage errors too.
    assert run_doctor() == cli.USAGE_ERROR
    assert run_doctor("x.py", "--explain", "SK012") == cli.USAGE_ERROR


def test_help_says_that_a_factory_target_runs_its_module(capsys: pytest.CaptureFixture[str]):
    """A factory in a file from elsewhere runs that file's code: the help must say so before a
    user points doctor at it (a script target is only read)."""
    with pytest.raises(SystemExit) as done:
        cli.main(["doctor", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "not executed" in text
    assert "A factory's module is imported, which executes its top- level code" in text or (
        "A factory's module is imported, which executes its top-level code" in text
    )
