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
