"""stoker.toml: validated, applied to arguments left at their defaults."""

from __future__ import annotations

import pytest

import stoker
from stoker._config import load_config, write_config


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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[loader]\nworkers = 2\n", "unknown key `loader.workers`"),
        ("[loader]\nnum_workers = -1\n", "`loader.num_workers` must be int or 'auto'"),
        ("[loader]\nbackend = 'gpu'\n", "`loader.backend` must be 'process' or 'thread'"),
        ("[loader]\npin_memory = 1\n", "`loader.pin_memory` must be bool"),
        ("loader = 3\n", "must be a table"),
        ("[loader\n", "not valid TOML"),
    ],
)
def test_bad_files_name_the_key_and_value(tmp_path, text, message):
    path = tmp_path / "stoker.toml"
    path.write_text(text)
    with pytest.raises(stoker.ConfigError, match=message.replace("(", r"\(").replace("'", "'")):
        load_config(path)


def test_missing_file_names_the_fix(tmp_path):
    with pytest.raises(stoker.ConfigError, match="stoker tune"):
        stoker.DataLoader([1], config=tmp_path / "nope.toml")
