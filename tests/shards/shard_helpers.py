"""Helpers for the shard tests (a module of its own: spawned workers import test modules, and
``conftest`` would resolve to the root one there)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def run_cli(command: str, *argv: str) -> int:
    """Run `stoker pack` / `stoker index` as the console script does (its exit status: 2 for a
    usage error, which ``stoker.cli.main`` reports)."""
    from stoker.cli import main

    return main([command, *argv])


def subprocess_env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src, str(HERE), env.get("PYTHONPATH", "")])
    return env


def make_image_folder(root: Path, classes: int = 3, per_class: int = 6, size: int = 24) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class_{c}"
        (folder / "nested").mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (size, size + i, 3), dtype=np.uint8)
            target = (
                folder / ("nested" if i % 3 == 0 else "") / f"img_{i}.{'jpeg' if i == 1 else 'jpg'}"
            )
            Image.fromarray(pixels).save(target, quality=90)
        (folder / "notes.txt").write_text("not an image")
    return root
