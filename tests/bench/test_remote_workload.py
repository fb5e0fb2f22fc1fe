"""The `remote` bench workload: settings, registration, notes, and a real run end to end.

The end-to-end run uses moto's real server through the proxy (no latency, no cap, 40 images)
and every contender that is installed; it asserts what each delivered and downloaded, never
how fast.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.bench import make_plan
from stoker.bench._remote import (
    NAME,
    RemoteSettings,
    _notes,
    _Tally,
    configured,
    remote_workload,
    run_remote,
)
from stoker.bench._remote_peers import BUCKET, PEERS, upload_folder
from stoker.bench._s3server import s3_server
from stoker.bench._workloads import CACHE_ENV, get_workload
from stoker.errors import ConfigError

from ._factories import runs

IMAGES = 40


def _needs_server() -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (stoker[bench])")
    pytest.importorskip("boto3", reason="boto3 is not installed (comes with moto)")


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"latency_s": -0.1}, "`latency_s`"),
        ({"bandwidth": 0}, "`bandwidth`"),
        ({"images": 0}, "`images`"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RemoteSettings(**kwargs)


def test_remote_is_registered_with_its_own_runner() -> None:
    workload = get_workload(NAME)
    assert workload.runner is not None and workload.mode == "epochs"
    assert "50 ms per request, 50 MB/s per connection" in workload.description
    custom = remote_workload(RemoteSettings(latency_s=0.2, bandwidth=None))
    assert "200 ms per request, no cap per connection" in custom.description


def test_notes_give_bytes_per_epoch_and_ratios_to_stoker() -> None:
    tally = _Tally(
        runs={
            "stoker cold": list(runs(50.0)),
            "stoker warm": list(runs(100.0)),
            "litdata cold": list(runs(25.0)),
            "litdata warm": [],
        },
        downloaded={
            "stoker cold": [48_000_000],
            "stoker warm": [0],
            "litdata cold": [80_000_000],
            "litdata warm": [],
        },
        errors={"litdata warm": "boom"},
    )
    notes = _notes(RemoteSettings(), make_plan(quick=True, cores=2), 100, tally, ["x: missing"])
    text = "\n".join(notes)
    assert "stoker cold 48.0, stoker warm 0.0, litdata cold 80.0" in text
    assert "stoker's cold epoch runs at 0.50 of its warm rate" in text
    assert "cold, samples/s relative to stoker: litdata 0.50x" in text
    assert "warm, samples/s" not in text  # litdata warm failed: nothing to compare
    assert notes[-1] == "x: missing"


def test_upload_folder_puts_every_file_under_the_prefix(tmp_path: Path) -> None:
    _needs_server()
    for name in ("index.json", "shard-000000.tar", "shard-000001.tar"):
        (tmp_path / name).write_bytes(name.encode())
    (tmp_path / "sub").mkdir()
    with s3_server(latency_s=0.0, bandwidth=None) as endpoint:
        client = endpoint.client(direct=True)
        try:
            client.create_bucket(Bucket=BUCKET)
            upload_folder(client, tmp_path, "test-upload")
            listed = client.list_objects_v2(Bucket=BUCKET, Prefix="test-upload/")["Contents"]
            body = client.get_object(Bucket=BUCKET, Key="test-upload/index.json")["Body"].read()
        finally:
            client.close()
    assert sorted(o["Key"] for o in listed) == [
        "test-upload/index.json",
        "test-upload/shard-000000.tar",
        "test-upload/shard-000001.tar",
    ]
    assert body == b"index.json"


@pytest.mark.slow
# The libraries keep process-wide S3 clients once used (stoker's first remote epoch leaves 3
# fds in this process after its loader and dataset are gone; LitData's optimize and clients
# more): a leak check here would measure them, not the bench.
@pytest.mark.allow_leaks
def test_every_installed_contender_reads_every_sample_cold_and_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_server()
    pytest.importorskip("PIL", reason="Pillow is not installed (stoker[bench])")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    settings = RemoteSettings(latency_s=0.0, bandwidth=None, images=IMAGES)
    workload = remote_workload(settings)
    messages: list[str] = []
    result = run_remote(
        workload,
        make_plan(quick=True, repeats=1, cores=2),
        True,
        lambda message, steps: messages.append(message),
        settings,
    )
    assert result.error is None, result.error
    installed = [p.name for p in PEERS if p.installed()]
    assert "stoker" in installed
    assert [c.name for c in result.contenders] == [
        f"{name} {state}" for name in installed for state in ("cold", "warm")
    ]
    for contender in result.contenders:
        assert contender.ok, (contender.name, contender.error)
        assert [r.samples for r in contender.runs] == [IMAGES]
    downloaded = next(n for n in result.notes if n.startswith("MB downloaded"))
    assert "stoker warm 0.0" in downloaded  # the warm epoch reads its cache
    assert not any((tmp_path / "remote-caches").iterdir())  # each run's cache is removed


def test_cli_options_set_the_remote_store() -> None:
    chosen = configured(["tiny", "remote"], 120.0, 0.0)
    assert chosen[0] == "tiny"
    remote = chosen[1]
    assert not isinstance(remote, str)
    assert "120 ms per request, no cap per connection" in remote.description
    default = configured(["remote"], None, 10.0)[0]
    assert not isinstance(default, str)
    assert "50 ms per request, 10 MB/s per connection" in default.description


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-w", "tiny", "--latency-ms", "5"], "add `-w remote`"),
        (["--bandwidth-mbs", "5"], "add `-w remote`"),
        (["-w", "remote", "--latency-ms", "-1"], "`--latency-ms` must be >= 0"),
    ],
)
def test_cli_store_options_without_remote_or_negative_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from stoker.cli import main

    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
