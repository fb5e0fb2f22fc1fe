"""`stoker pack`: sources, determinism across workers, atomicity, kill and --resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from shard_helpers import run_cli, subprocess_env

from stoker.errors import ConfigError
from stoker.shards import IncompleteShardsError, ShardDataset, ShardError, pack, read_index
from stoker.shards._index import PACK_STATE_NAME
from stoker.shards._pack_cli import parse_size

# Kill test: per-sample delay of the packing subprocess and how long to wait for its shards.
SLOW_SAMPLE_S = 0.03
KILL_WAIT_S = 60.0
POLL_S = 0.02


def _tree_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_image_folder_labels_and_bytes(image_folder: Path, packed: Path) -> None:
    ds = ShardDataset(packed, decode="bytes")
    index = read_index(packed)
    assert len(index.shards) > 1
    assert ds.meta["classes"] == ["class_0", "class_1", "class_2"]
    files = sorted(
        (p for p in image_folder.rglob("*") if p.suffix in (".jpg", ".jpeg")),
        key=lambda p: (p.relative_to(image_folder).parts[0], str(p.parent), p.name),
    )
    assert len(ds) == len(files) == 18
    by_bytes = {p.read_bytes(): int(p.relative_to(image_folder).parts[0][-1]) for p in files}
    for i in range(len(ds)):
        sample = ds[i]
        assert set(sample) == {"__key__", "__shard__", "cls", "jpg"}
        assert by_bytes[sample["jpg"]] == int(sample["cls"])
    assert not (packed / PACK_STATE_NAME).exists()
    ds.close()


def test_output_does_not_depend_on_workers(image_folder: Path, tmp_path: Path) -> None:
    one, three = tmp_path / "one", tmp_path / "three"
    pack(image_folder, one, shard_size=20_000, workers=1)
    pack(image_folder, three, shard_size=20_000, workers=3)
    assert _tree_bytes(one) == _tree_bytes(three)


def test_factory_dataset_fields_are_encoded_by_extension(tmp_path: Path) -> None:
    from shard_factories import FieldsDataset

    out = tmp_path / "out"
    assert (
        run_cli(
            "pack",
            "shard_factories:fields_dataset",
            str(out),
            "--shard-size",
            "64KB",
            "--no-progress",
        )
        == 0
    )
    ds = ShardDataset(out, decode="numpy")
    want = FieldsDataset(40)
    assert len(ds) == 40
    for i in (0, 17, 39):
        got, ref = ds[i], want[i]
        np.testing.assert_array_equal(got["npy"], ref["npy"])
        np.testing.assert_array_equal(got["png"], ref["png"])  # lossless
        assert got["cls"] == ref["cls"] and got["json"] == ref["json"] and got["txt"] == ref["txt"]
        assert got["bin"] == ref["bin"]
    ds.close()


def test_tuple_samples_need_fields(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="--fields jpg,cls"):
        pack("shard_factories:tuple_dataset", tmp_path / "a")
    # The failed pack left nothing behind: the corrected command runs into the same place.
    pack("shard_factories:tuple_dataset", tmp_path / "a", fields=["png", "cls"])
    ds = ShardDataset(tmp_path / "a", decode="numpy", fields=("png", "cls"))
    image, label = ds[3]
    assert label == 3 and image.shape == (4, 4, 3) and int(image[0, 0, 0]) == 30


def test_file_groups_keep_their_stems(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for stem in ("a", "b", "sub/c"):
        (src / f"{stem}.txt").write_text(f"text {stem}")
        (src / f"{stem}.seg.json").write_text(f'{{"stem": "{stem}"}}')
    (src / ".hidden.txt").write_text("skip")
    pack(src, tmp_path / "out")
    ds = ShardDataset(tmp_path / "out", decode="pil")
    assert [ds[i]["__key__"] for i in range(len(ds))] == ["a", "b", "sub/c"]
    assert ds[2]["seg.json"] == {"stem": "sub/c"} and ds[2]["txt"] == "text sub/c"


def test_refuses_a_non_empty_output_and_bad_arguments(image_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_text("")
    with pytest.raises(ShardError, match="not empty"):
        pack(image_folder, out)
    with pytest.raises(ConfigError, match=r"`workers` must be an int >= 1\. Found: 0"):
        pack(image_folder, tmp_path / "o2", workers=0)
    with pytest.raises(ConfigError, match="`shard_size`"):
        pack(image_folder, tmp_path / "o3", shard_size=100)
    assert not (tmp_path / "o3").exists()  # no state file to block the corrected command
    (tmp_path / "afile").write_text("")
    with pytest.raises(ShardError, match="is a file: pass a directory"):
        pack(image_folder, tmp_path / "afile")
    with pytest.raises(ShardError, match="does not exist"):
        pack(tmp_path / "nope", tmp_path / "o4")
    assert run_cli("pack", str(image_folder), str(out), "--no-progress") == 2  # usage error


def test_parse_size() -> None:
    assert parse_size("256MB") == 256_000_000
    assert parse_size("1GiB") == 2**30
    assert parse_size("4096") == 4096
    assert parse_size("1.5k") == 1500


def _start_pack(source: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    code = (
        "import sys; sys.argv[0] = 'stoker'; from shard_helpers import run_cli; "
        "sys.exit(run_cli('pack', *sys.argv[1:]))"
    )
    env = subprocess_env()
    env["STOKER_TEST_SAMPLE_S"] = str(SLOW_SAMPLE_S)
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            source,
            str(out),
            "--shard-size",
            "16KB",
            "--no-progress",
            *extra,
        ],
        env=env,
        cwd=Path(__file__).parent,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_killed_pack_is_incomplete_and_resume_gives_the_same_bytes(tmp_path: Path) -> None:
    # In this process the factory does not sleep (STOKER_TEST_SAMPLE_S is unset).
    reference = tmp_path / "reference"
    pack("shard_factories:slow_dataset", reference, shard_size=16_000)
    out = tmp_path / "killed"
    proc = _start_pack("shard_factories:slow_dataset", out)
    try:
        deadline = time.monotonic() + KILL_WAIT_S
        while not (out / "shard-000002.tar").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "pack wrote no shards in time"
            time.sleep(POLL_S)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "index.json").exists()
    assert len(read_index(reference).shards) > 3  # the kill happened part-way
    with pytest.raises(IncompleteShardsError, match=r"stoker pack --resume"):
        ShardDataset(out)
    with pytest.raises(ShardError, match="`--resume` must repeat"):
        pack("shard_factories:slow_dataset", out, shard_size=32_000, resume=True)
    with pytest.raises(ShardError, match="--resume"):
        pack("shard_factories:slow_dataset", out, shard_size=16_000)
    assert (
        run_cli(
            "pack",
            "shard_factories:slow_dataset",
            str(out),
            "--shard-size",
            "16000",
            "--resume",
            "--workers",
            "2",
            "--no-progress",
        )
        == 0
    )
    assert _tree_bytes(out) == _tree_bytes(reference)
    with pytest.raises(ShardError, match="nothing to resume"):
        pack("shard_factories:slow_dataset", out, shard_size=16_000, resume=True)


@pytest.mark.parametrize("factory", ["dying_dataset", "dying_first_dataset"])
def test_a_pack_worker_killed_is_an_error_and_resume_finishes(tmp_path: Path, factory: str) -> None:
    """multiprocessing.Pool waited forever for a dead worker's chunk; a death before the first
    shard was complete once dropped the state file the error told the user to resume from."""
    out = tmp_path / "out"
    code = (
        "import sys; sys.argv[0] = 'stoker'; from shard_helpers import run_cli; "
        f"sys.exit(run_cli('pack', 'shard_factories:{factory}', sys.argv[1], '--workers', "
        "'2', '--shard-size', '16KB', '--no-progress'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        env=subprocess_env(),
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=KILL_WAIT_S,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "a pack worker died" in done.stderr and "--resume" in done.stderr, done.stderr
    assert not (out / "index.json").exists()
    # In this process sample 25 loads: resuming finishes the pack, as a clean one would.
    pack(f"shard_factories:{factory}", out, shard_size=16_000, resume=True)
    pack(f"shard_factories:{factory}", tmp_path / "reference", shard_size=16_000)
    assert _tree_bytes(out) == _tree_bytes(tmp_path / "reference")


def test_progress_bar(
    image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pack(image_folder, tmp_path / "out", progress=True, workers=2)
    assert "packing" in capsys.readouterr().out
    assert len(ShardDataset(tmp_path / "out")) == 18


def test_cli_rows_point_at_the_shard_commands() -> None:
    import argparse
    import importlib

    from stoker.cli import _COMMANDS

    for name in ("pack", "index"):
        module = importlib.import_module(_COMMANDS[name][0])
        parser = argparse.ArgumentParser()
        module.configure(parser)
        assert callable(module.run)
    assert _COMMANDS["pack"][0] == "stoker.shards._pack_cli"
