"""stoker.toml: validated, applied to arguments left at their defaults."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import stoker
from stoker.errors import ConfigError
from stoker.loader._config import MAX_CONFIG_BYTES, load_config, write_config


def test_round_trip(tmp_path):
    path = write_config(
        tmp_path / "stoker.toml",
        {"backend": "thread", "num_workers": 3, "prefetch_factor": 4, "pin_memory": False},
        "found by stoker tune\n2.1x torch's defaults",
    )
    assert path.read_text().startswith("# found by stoker tune\n# 2.1x")
    assert load_config(path) == {
        "backend": "thread",
        "num_workers": 3,
        "prefetch_factor": 4,
        "pin_memory": False,
    }


def test_config_fills_defaults_and_explicit_arguments_win(tmp_path):
    path = write_config(tmp_path / "s.toml", {"num_workers": 2, "prefetch_factor": 3}, "x")
    loader = stoker.DataLoader(list(range(8)), batch_size=2, config=path)
    assert loader.num_workers == 2 and loader.prefetch_factor == 3
    loader = stoker.DataLoader(list(range(8)), batch_size=2, num_workers=1, config=path)
    assert loader.num_workers == 1 and loader.prefetch_factor == 3


def test_an_argument_passed_at_its_default_value_still_wins(tmp_path):
    """num_workers=0 (to debug in the main process) is also the default: passed, it wins over
    the file, and the file's settings that need workers do not apply."""
    path = write_config(
        tmp_path / "s.toml", {"num_workers": 2, "prefetch_factor": 3, "in_order": False}, "x"
    )
    loader = stoker.DataLoader(list(range(8)), batch_size=2, num_workers=0, config=path)
    assert loader.num_workers == 0 and loader.prefetch_factor is None
    assert loader.in_order is False  # left out: the file's
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    loader = stoker.DataLoader(list(range(8)), batch_size=2, in_order=True, config=path)
    assert loader.num_workers == 2 and loader.in_order is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[loader]\nworkers = 2\n", "unknown key `loader.workers`"),
        ("[loader]\nnum_workers = -1\n", "`loader.num_workers` must be int or 'auto'"),
        ("[loader]\nbackend = 'gpu'\n", "`loader.backend` must be 'process' or 'thread'"),
        ("[loader]\npin_memory = 1\n", "`loader.pin_memory` must be bool"),
        ("loader = 3\n", "must be a table"),
        ("[loader\n", "not valid TOML"),
        ("[loadr]\nnum_workers = 2\n", r"unknown table\(s\) `\[loadr\]`"),
        ("[loader]\nprefetch_factor = 0\n", "`loader.prefetch_factor` must be int or 'auto'"),
        (b"[loader]\nbackend = '\xff'\n", "cannot be read as TOML text"),
    ],
)
def test_bad_files_name_the_key_and_value(tmp_path, text, message):
    path = tmp_path / "stoker.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    pattern = message if "\\" in message else message.replace("(", r"\(")
    with pytest.raises(stoker.ConfigError, match=pattern):
        load_config(path)


def test_a_directory_is_not_a_config_file(tmp_path):
    with pytest.raises(stoker.ConfigError, match="cannot be read as TOML text"):
        load_config(tmp_path)


def test_missing_file_names_the_fix(tmp_path):
    with pytest.raises(stoker.ConfigError, match="stoker tune"):
        stoker.DataLoader([1], config=tmp_path / "nope.toml")


@pytest.fixture
def four_cores(monkeypatch):
    import stoker.loader._config as config

    monkeypatch.setattr(config, "usable_cores", lambda: 4)


@pytest.mark.parametrize(
    ("key", "largest"),
    [("num_workers", 16 * 4), ("prefetch_factor", 64)],
)
def test_counts_past_their_cap_name_file_value_cap_and_knob(tmp_path, four_cores, key, largest):
    from stoker.loader._config import MAX_PREFETCH_FACTOR, MAX_WORKERS_PER_CORE

    assert largest == (MAX_WORKERS_PER_CORE * 4 if key == "num_workers" else MAX_PREFETCH_FACTOR)
    path = tmp_path / "big.toml"
    path.write_text(f"[loader]\n{key} = {largest}\n")
    assert load_config(path)[key] == largest  # the cap itself is allowed
    path.write_text(f"[loader]\n{key} = {largest + 1}\n")
    with pytest.raises(stoker.ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message and f"`loader.{key} = {largest + 1}`" in message
    assert f"more than {largest}" in message
    if key == "num_workers":
        assert "16 per usable core x 4 cores here" in message


def test_a_huge_count_in_a_file_is_rejected_by_the_loader(tmp_path):
    path = tmp_path / "stoker.toml"
    path.write_text("[loader]\nnum_workers = 100000\n")
    with pytest.raises(stoker.ConfigError, match="num_workers = 100000` is more than"):
        stoker.DataLoader(list(range(8)), config=path)
    path.write_text(f"[loader]\nnum_workers = 2\nprefetch_factor = {10**6}\n")
    with pytest.raises(stoker.ConfigError, match="prefetch_factor = 1000000` is more than 64"):
        stoker.DataLoader(list(range(8)), config=path)


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 8, 16, 64, 128])
def test_what_stoker_tune_writes_is_within_the_caps(cores):
    from stoker.loader._config import MAX_PREFETCH_FACTOR, MAX_WORKERS_PER_CORE
    from stoker.tuner._tune import PREFETCH, worker_counts

    most = max(worker_counts(cores, waits=True) + worker_counts(cores))
    assert most <= MAX_WORKERS_PER_CORE * cores
    assert max(PREFETCH) <= MAX_PREFETCH_FACTOR


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "oversize"])
def test_a_config_that_is_not_a_small_regular_file_is_refused_at_once(
    tmp_path: Path, kind: str
) -> None:
    """A stoker.toml from a cloned repository linked to /dev/zero read until memory ran out
    (MemoryError); a FIFO blocked forever."""
    path = tmp_path / "stoker.toml"
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match="cannot be read as TOML text"):
        load_config(path)
