"""`stoker pack` and `stoker index` in folders other users can write to: the walk ends and stays
inside SRC, reads only regular files, writes cannot be redirected by a planted link, and the
commands exit 2 on a usage error, 1 on a failed run."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from shard_helpers import make_image_folder, run_cli

from stoker.cli import main
from stoker.shards import ShardDataset, ShardError, ShardWriter, build_index, pack
from stoker.shards._errors import ShardArgumentError
from stoker.shards._files import write_atomic
from stoker.shards._pack import _prepare
from stoker.shards._sources import FileGroupSource, open_source
from stoker.shards._tar import encode_sample, end_of_archive

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from _isolate import run_case

# Hard limit of a pack that never ended before (a link loop, a FIFO in SRC).
HANG_LIMIT_S = 30.0
SHARD_SIZE = 1 << 20
NOBODY = 65534
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root to make a folder owned by another user",
)


def _src(root: Path) -> Path:
    """``x.txt`` and ``sub/y.txt``: two samples, keys ``x`` and ``sub/y``."""
    (root / "sub").mkdir(parents=True)
    (root / "x.txt").write_bytes(b"hello x")
    (root / "sub" / "y.txt").write_bytes(b"hello y")
    return root


def _packed(out: Path) -> dict[str, bytes]:
    ds = ShardDataset(out, decode="bytes")
    try:
        return {s["__key__"]: s["txt"] for s in (ds[i] for i in range(len(ds)))}
    finally:
        ds.close()


def _pack_warned(src: Path, out: Path, **kwargs: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pack(src, out, shard_size=SHARD_SIZE, **kwargs)
    return [str(w.message) for w in caught]


# -- the walk ends (in a child with a hard limit: before, these never finished) --


def _pack_isolated(src: Path, out: Path, follow_links: bool) -> Any:
    """``case_pack`` in a child with a hard limit (a regression must not hang the suite);
    the two regular samples are packed whatever else SRC holds."""
    run = run_case(
        case_pack, limit_s=HANG_LIMIT_S, src=str(src), out=str(out), follow_links=follow_links
    )
    assert run.result["packed"] == {"x": b"hello x", "sub/y": b"hello y"}
    return run


def case_pack(src: str, out: str, follow_links: bool) -> dict[str, Any]:
    kwargs = {"follow_links": True} if follow_links else {}
    found = _pack_warned(Path(src), Path(out), **kwargs)
    return {"packed": _packed(Path(out)), "warnings": found}


@pytest.mark.parametrize("follow_links", [False, True], ids=["default", "follow_links"])
def test_pack_with_a_link_loop_finishes(tmp_path: Path, follow_links: bool) -> None:
    src = _src(tmp_path / "src")
    os.symlink(".", src / "a")
    os.symlink("..", src / "sub" / "b")
    run = _pack_isolated(src, tmp_path / "out", follow_links)
    (message,) = run.result["warnings"]
    assert "'a'" in message and "'sub/b'" in message
    assert ("already walked" if follow_links else "symbolic link") in message


@pytest.mark.parametrize("follow_links", [False, True], ids=["default", "follow_links"])
def test_pack_with_a_fifo_in_src_finishes_and_names_it(tmp_path: Path, follow_links: bool) -> None:
    src = _src(tmp_path / "src")
    os.mkfifo(src / "z.txt")
    run = _pack_isolated(src, tmp_path / "out", follow_links)
    (message,) = run.result["warnings"]
    assert "'z.txt': a FIFO" in message


@pytest.mark.parametrize("follow_links", [False, True], ids=["default", "follow_links"])
def test_a_link_to_a_device_is_not_read(tmp_path: Path, follow_links: bool) -> None:
    """Before: links were followed, and /dev/zero was read without end."""
    src = _src(tmp_path / "src")
    os.symlink("/dev/zero", src / "zero.txt")
    run = _pack_isolated(src, tmp_path / "out", follow_links)
    why = "a symbolic link to '/dev/zero', outside" if follow_links else "a symbolic link ("
    assert f"'zero.txt': {why}" in run.result["warnings"][0]


# -- the walk stays inside SRC --


@pytest.mark.parametrize("follow_links", [False, True], ids=["default", "follow_links"])
def test_a_link_leaving_src_is_not_packed(tmp_path: Path, follow_links: bool) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_bytes(b"TOPSECRET")
    src = _src(tmp_path / "src")
    os.symlink(secret / "key.txt", src / "leak.txt")
    os.symlink(secret, src / "leakdir")
    found = _pack_warned(src, tmp_path / "out", follow_links=follow_links)
    assert _packed(tmp_path / "out") == {"x": b"hello x", "sub/y": b"hello y"}
    for shard in (tmp_path / "out").glob("*.tar"):
        assert b"TOPSECRET" not in shard.read_bytes()
    assert "'leak.txt'" in found[0] and "'leakdir'" in found[0]


def test_links_inside_src_are_packed_only_when_followed(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    os.symlink("x.txt", src / "alias.txt")
    os.symlink("sub", src / "linked")
    found = _pack_warned(src, tmp_path / "default")
    assert _packed(tmp_path / "default") == {"x": b"hello x", "sub/y": b"hello y"}
    assert "'alias.txt': a symbolic link" in found[0]
    assert _pack_warned(src, tmp_path / "followed", follow_links=True) == [
        # `linked` is `sub` again: walked once.
        f"files:{src}: 1 entry is not packed (only regular files inside the source are): "
        "'linked': a folder already walked (a link loop?)."
    ]
    assert _packed(tmp_path / "followed") == {
        "alias": b"hello x",
        "x": b"hello x",
        "sub/y": b"hello y",
    }


def test_image_folder_skips_a_class_linked_outside_src(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "images", classes=2, per_class=2)
    outside = make_image_folder(tmp_path / "elsewhere", classes=1, per_class=2)
    os.symlink(outside / "class_0", src / "class_9")
    found = _pack_warned(src, tmp_path / "out", follow_links=True)
    ds = ShardDataset(tmp_path / "out")
    assert len(ds) == 4 and ds.meta["classes"] == ["class_0", "class_1", "class_9"]
    ds.close()
    assert "'class_9': a symbolic link to" in found[0] and "outside the source" in found[0]


def test_a_folder_swapped_for_a_link_after_the_walk_is_not_read(tmp_path: Path) -> None:
    """A file is opened a component at a time with O_NOFOLLOW: a link put in the way between
    listing and reading cannot lead out of SRC."""
    src = _src(tmp_path / "src")
    source = FileGroupSource(src)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "y.txt").write_bytes(b"TOPSECRET")
    shutil.rmtree(src / "sub")
    os.symlink(elsewhere, src / "sub")
    assert [key for key, _ in source.groups] == ["sub/y", "x"]
    with pytest.raises(ShardError, match="changed since the source was listed"):
        source.sample(0)
    assert source.sample(1) == ("x", [("txt", b"hello x")])


# -- writes cannot be redirected --


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"VICTIM")
    return victim


def _shard_dir(directory: Path) -> Path:
    directory.mkdir()
    blob = encode_sample("k", [("txt", b"data")]).blob
    (directory / "a.tar").write_bytes(blob + end_of_archive(len(blob)))
    return directory


def test_a_link_planted_at_the_index_temp_name_does_not_redirect_the_write(
    tmp_path: Path,
) -> None:
    victim = _victim(tmp_path)
    shards = _shard_dir(tmp_path / "shards")
    os.symlink(victim, shards / ".index.json.tmp")
    build_index(shards)
    assert victim.read_bytes() == b"VICTIM"
    assert stat.S_ISREG((shards / "index.json").lstat().st_mode)
    assert _packed(shards) == {"k": b"data"}


def test_a_link_planted_at_the_shard_temp_name_does_not_redirect_the_write(
    tmp_path: Path,
) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / ".shard-000000.tar.tmp")
    writer = ShardWriter(out, shard_size=SHARD_SIZE)
    writer.write(encode_sample("k", [("txt", b"data")]))
    (info,) = writer.close()
    assert victim.read_bytes() == b"VICTIM"
    assert stat.S_ISREG((out / info.name).lstat().st_mode)


def test_a_link_planted_at_the_pack_state_temp_name_does_not_redirect_the_write(
    tmp_path: Path,
) -> None:
    victim = _victim(tmp_path)
    os.symlink(victim, tmp_path / "..stoker-pack.json.tmp")  # the name it was written under
    write_atomic(tmp_path / ".stoker-pack.json", b"{}")
    assert victim.read_bytes() == b"VICTIM"
    assert (tmp_path / ".stoker-pack.json").read_bytes() == b"{}"


def test_a_link_planted_at_the_index_name_is_replaced_not_written_through(
    tmp_path: Path,
) -> None:
    victim = _victim(tmp_path)
    shards = _shard_dir(tmp_path / "shards")
    os.symlink(victim, shards / "index.json")
    build_index(shards)
    assert victim.read_bytes() == b"VICTIM"
    assert stat.S_ISREG((shards / "index.json").lstat().st_mode)


def test_written_files_get_the_mode_open_would_give_them(tmp_path: Path) -> None:
    """mkstemp creates 0600; shards and the index are then shared as the umask shares files."""
    old = os.umask(0o027)
    try:
        pack(_src(tmp_path / "src"), tmp_path / "out", shard_size=SHARD_SIZE)
    finally:
        os.umask(old)
    for path in (tmp_path / "out").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path


@as_root
def test_an_output_folder_others_may_write_to_is_refused(tmp_path: Path) -> None:
    shared = _shard_dir(tmp_path / "shared")
    shared.chmod(0o777)
    os.chown(shared, NOBODY, NOBODY)
    with pytest.raises(ShardArgumentError, match=r"may be written by other users \(mode 0o777"):
        build_index(shared)
    with pytest.raises(ShardArgumentError, match="chmod go-w"):
        ShardWriter(shared, shard_size=SHARD_SIZE)
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o777)
    empty.chmod(0o777)
    os.chown(empty, NOBODY, NOBODY)
    with pytest.raises(ShardArgumentError, match="may be written by other users"):
        pack(_src(tmp_path / "src"), empty, shard_size=SHARD_SIZE)
    assert list(empty.iterdir()) == []
    assert run_cli("index", str(shared)) == 2


@as_root
def test_a_sticky_or_own_writable_folder_is_accepted(tmp_path: Path) -> None:
    sticky = _shard_dir(tmp_path / "sticky")
    sticky.chmod(0o1777)
    os.chown(sticky, NOBODY, NOBODY)
    build_index(sticky)
    own = _shard_dir(tmp_path / "own")
    own.chmod(0o777)
    build_index(own)


# -- exit status: 2 for a usage error, 1 for a failed run --


def _one_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """A failed run's stderr: one line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"stoker {command}: "), err
    return err


def _usage_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """A usage error's stderr: the command's usage, then one line naming the problem."""
    err = capsys.readouterr().err
    assert err.startswith(f"usage: stoker {command} ") and "Traceback" not in err, err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"stoker {command}: error: "), err
    return last


def test_index_of_a_missing_path_says_it_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli("index", str(tmp_path / "missing")) == 2
    err = _usage_line(capsys, "index")
    assert "does not exist" in err and "has no" not in err


@pytest.mark.parametrize("what", ["a_file", "an_empty_folder"])
def test_index_of_a_path_without_tar_files_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    path = tmp_path / what
    if what == "a_file":
        path.write_text("")
    else:
        path.mkdir()
    assert run_cli("index", str(path)) == 2
    assert str(path) in _usage_line(capsys, "index")


def test_index_of_a_bad_tar_is_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.tar").write_bytes(b"\x1f\x8b not a tar" * 100)
    assert run_cli("index", str(tmp_path)) == 1
    assert "not a readable uncompressed tar" in _one_line(capsys, "index")


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing_src", "does not exist"),
        ("workers_0", "`workers` must be an int >= 1. Found: 0"),
        ("shard_size_too_small", "`shard_size` must be an int >= 10240"),
        ("out_not_empty", "is not empty"),
        ("out_a_file", "is a file"),
        ("resume_without_a_pack", "no interrupted pack"),
    ],
)
def test_pack_usage_errors_exit_2_with_the_usage_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, says: str
) -> None:
    src = _src(tmp_path / "src")
    out = tmp_path / "out"
    args = [str(src), str(out), "--no-progress"]
    if case == "missing_src":
        args[0] = str(tmp_path / "missing")
    elif case == "workers_0":
        args += ["--workers", "0"]
    elif case == "shard_size_too_small":
        args += ["--shard-size", "100"]
    elif case == "out_not_empty":
        out.mkdir()
        (out / "x").write_text("")
    elif case == "out_a_file":
        out.write_text("")
    elif case == "resume_without_a_pack":
        args += ["--resume"]
    assert run_cli("pack", *args) == 2
    assert says in _usage_line(capsys, "pack")


def test_pack_argparse_errors_exit_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["pack", str(tmp_path), str(tmp_path / "out"), "--shard-size", "lots"])
    assert info.value.code == 2


def test_a_failed_pack_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("pack", "shard_factories:tuple_dataset", str(tmp_path / "out")) == 1
    assert "--fields" in _one_line(capsys, "pack")


def test_resume_must_repeat_follow_links(tmp_path: Path) -> None:
    """Following links lists other files: a pack resumed with the other setting is refused."""
    src = _src(tmp_path / "src")
    os.symlink("x.txt", src / "alias.txt")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _prepare(out, open_source(src), SHARD_SIZE, resume=False, follow_links=False)
        with pytest.raises(ShardArgumentError, match="`--resume` must repeat"):
            pack(src, out, shard_size=SHARD_SIZE, resume=True, follow_links=True)
        pack(src, out, shard_size=SHARD_SIZE, resume=True)
    assert _packed(out) == {"x": b"hello x", "sub/y": b"hello y"}
