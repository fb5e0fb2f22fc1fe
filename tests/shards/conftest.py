"""Fixtures for shard tests: real JPEG folders, and the pack/index commands run for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


from shard_helpers import make_image_folder, run_cli  # noqa: E402 (needs HERE on sys.path)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "images")


@pytest.fixture
def packed(image_folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "shards"
    assert (
        run_cli("pack", str(image_folder), str(out), "--shard-size", "20KB", "--no-progress") == 0
    )
    return out
