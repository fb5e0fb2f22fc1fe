"""`stoker bench` end to end on a tiny dataset of the user's (real workers, real files)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import MappingProxyType

import pytest

import stoker.bench as bench
from stoker.bench._cli import load_factory
from stoker.bench._json import read_json
from stoker.cli import main
from stoker.errors import ConfigError

USER_MODULE = textwrap.dedent(
    """
    import torch
    from torch.utils.data import Dataset

    class Tokens(Dataset):
        def __len__(self):
            return 256

        def __getitem__(self, idx):
            return torch.full((8,), idx)

    def make_dataset():
        return Tokens()

    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "bench_user_mod.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the import takes the folder off it
    monkeypatch.setattr(
        bench,
        "QUICK_TIMINGS",
        MappingProxyType(
            {
                "run_s": 0.03,
                "warmup_s": 0.01,
                "grid_run_s": 0.02,
                "ideal_s": 0.02,
                "auto_settle_s": 0.05,
                "fill_s": 0.0,
                "train_run_s": 0.05,
            }
        ),
    )
    monkeypatch.setattr(bench, "QUICK_GRID_WORKERS_PER_CORE", (0, 1))
    return tmp_path


def test_bench_own_dataset_writes_table_json_and_png(
    user_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_png = user_module / "r.json", user_module / "r.png"
    rc = main(
        [
            "bench",
            "--dataset",
            "bench_user_mod:make_dataset",
            "--batch-size",
            "16",
            "--quick",
            "--repeats",
            "1",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "bench_user_mod:make_dataset" in text and "verdict:" in text and "total time" in text
    doc = json.loads(out_json.read_text())
    assert doc["schema"] == "stoker.bench/1" and doc["quick"] is True and doc["repeats"] == 1
    w = doc["workloads"][0]
    assert w["batch_size"] == 16 and w["torch_best"] is not None
    failed = {c["name"]: c["error"] for c in w["contenders"] if c["error"] or not c["runs"]}
    assert not failed  # stoker's contenders included: the harness would catch their errors
    assert read_json(out_json).workloads[0].name == "bench_user_mod:make_dataset"
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "no_colon"], "must look like `module:factory`"),
        (["--dataset", "surely_missing_module_xyz:f"], "cannot import"),
        (["--dataset", "bench_user_mod:nope"], "has no attribute"),
        (["--dataset", "bench_user_mod:NOT_CALLABLE"], "is not callable"),
        (["--batch-size", "8"], "applies to `--dataset` only"),
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--workload", "tiny", "--repeats", "0"], "`repeats` must be >= 1"),
        # Checked before minutes of measuring, not when the results are written.
        (["-w", "tiny", "--json", "/nonexistent-dir/b.json"], "does not exist. Create it"),
        (["-w", "tiny", "--plot", "."], "`--plot .` is a directory"),
    ],
)
def test_bad_arguments_exit_2_with_the_fix(
    user_module: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_list_shows_every_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("tiny", "large", "jpeg", "heavytail", "io", "memory", "epochs"):
        assert name in out


def test_load_factory_resolves_dotted_attributes(user_module: Path) -> None:
    assert load_factory("bench_user_mod:Tokens.__len__") is not None
    with pytest.raises(ConfigError):
        load_factory(":f")
