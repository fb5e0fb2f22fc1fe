"""`stoker env` facts, environment-manager detection and the exported environment file."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml

from stoker._introspect import platform as _platform
from stoker.doctor._env import (
    collect_env,
    environment_manager,
    export_environment,
    pip_environment_yaml,
)


def test_collect_env_matches_the_platform_readings(tmp_path: Path) -> None:
    facts = collect_env(str(tmp_path))
    assert facts["torch"]["version"] == torch.__version__
    assert facts["torch"]["build"] == (
        f"CUDA {torch.version.cuda}" if torch.version.cuda else facts["torch"]["build"]
    )
    assert facts["cores"]["usable"] == _platform.usable_cores()
    assert facts["cores"]["os_cpu_count"] == os.cpu_count()
    assert facts["open_files"]["soft"] == _platform.open_files_limit()[0]
    assert facts["shm"]["dir"] == _platform.shm_dir()
    assert facts["shm"]["spill_dir"] == tempfile.gettempdir()
    assert facts["shm"]["spill_free_bytes"] > 0
    assert facts["data_dir"]["fs_type"] == _platform.fs_type(tmp_path)
    assert facts["python"]["executable"] == sys.executable


def test_environment_manager_detection(tmp_path: Path) -> None:
    conda_prefix = tmp_path / "envs" / "train"
    (conda_prefix / "conda-meta").mkdir(parents=True)
    assert environment_manager({}, str(conda_prefix)) == ("conda", str(conda_prefix))
    named = {"CONDA_PREFIX": str(conda_prefix), "CONDA_DEFAULT_ENV": "train"}
    assert environment_manager(named, str(conda_prefix)) == ("conda", "train")
    plain = tmp_path / "venv"
    plain.mkdir()
    # A conda base elsewhere does not make a venv a conda env.
    other = {"CONDA_PREFIX": str(conda_prefix)}
    expected = "system" if str(plain) == sys.base_prefix else "venv"
    assert environment_manager(other, str(plain))[0] == expected
    assert environment_manager({}, sys.base_prefix) == ("system", None)


def test_pip_yaml_pins_what_is_installed() -> None:
    doc = yaml.safe_load(pip_environment_yaml(name="t"))
    assert doc["name"] == "t"
    deps = doc["dependencies"]
    assert f"python={sys.version.split()[0]}" in deps
    pins = next(d["pip"] for d in deps if isinstance(d, dict))
    for dist in ("torch", "numpy", "psutil"):
        version = importlib.metadata.version(dist)
        assert f"{dist}=={version}" in pins
    local = torch.__version__.partition("+")[2]
    if local:
        assert f"--extra-index-url https://download.pytorch.org/whl/{local}" in pins
    assert not any(p.startswith("pip==") for p in pins if isinstance(p, str))


def test_export_writes_the_pip_file_outside_conda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if environment_manager()[0] == "conda":
        pytest.skip("conda is active: export delegates to `conda env export`")
    out = tmp_path / "environment.yml"
    assert export_environment(out) == "pip pins"
    assert yaml.safe_load(out.read_text())["dependencies"][0].startswith("python=")


def test_fs_type_and_kind(tmp_path: Path) -> None:
    assert _platform.fs_type(tmp_path) is not None
    if os.path.isdir("/dev/shm"):
        assert _platform.fs_kind(_platform.fs_type("/dev/shm")) == "memory"
    assert _platform.fs_kind("nfs4") == "network"
    assert _platform.fs_kind("fuse.sshfs") == "network"
    assert _platform.fs_kind("ext4") == "local"
    assert _platform.fs_kind(None) == "unknown"


def test_thread_env_vars_and_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert _platform.thread_env_vars()["OMP_NUM_THREADS"] == "3"
    assert "MKL_NUM_THREADS" not in _platform.thread_env_vars()
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = -1 if soft == resource.RLIM_INFINITY else soft
    assert _platform.open_files_limit()[0] == expected
    assert _platform.shm_total_bytes("/nonexistent-dir") == 0
