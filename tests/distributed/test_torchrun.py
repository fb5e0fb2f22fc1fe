"""Real multi-process runs: torchrun, gloo, CPU, two ranks (and one, for elastic resume).

Each launch runs ``_rank_script.py``; every rank writes what it loaded to a JSON file. The
launches are chained through module fixtures: train at 2 ranks and checkpoint mid-epoch ->
resume at 1 rank and checkpoint mid-epoch -> resume at 2 ranks.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).with_name("_rank_script.py")
# Hard limit for one torchrun launch.
LAUNCH_TIMEOUT_S = 120
N = 23  # odd: two ranks need one repeated sample (pad) to get equal shares
BATCH = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(ranks: int, out: Path, *args: str) -> list[dict[str, Any]]:
    """Run the rank script under torchrun; return each rank's report, in rank order."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={ranks}",
        "--nnodes=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=localhost:{_free_port()}",
        "--max-restarts=0",
        str(SCRIPT),
        *args[:1],
        str(out),
        *args[1:],
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env, check=False
    )
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stderr[-20000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def _samples(batches: list[list[int]]) -> list[int]:
    return [x for b in batches for x in b]


@pytest.fixture(scope="module", params=[0, 2], ids=["workers0", "workers2"])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp(f"train{request.param}")
    reports = launch(2, out, "train", f"--samples={N}", f"--workers={request.param}", "--steps=2")
    return out, reports


@pytest.fixture(scope="module")
def resumed_at_1(trained: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("resume1")
    ckpt = trained[0] / "ckpt.pt"
    reports = launch(1, out, "resume", f"--samples={N}", f"--ckpt={ckpt}", "--steps=3")
    return out, reports


def test_every_sample_once_per_epoch_and_equal_steps(trained: Any) -> None:
    _, reports = trained
    assert [r["world_size"] for r in reports] == [2, 2]
    for epoch in range(2):
        per_rank = [_samples(r["epochs"][epoch]) for r in reports]
        steps = [len(r["epochs"][epoch]) for r in reports]
        assert steps[0] == steps[1] == reports[0]["len"] == -(-12 // BATCH)
        assert len(per_rank[0]) == len(per_rank[1]) == 12
        counts = Counter(per_rank[0] + per_rank[1])
        assert set(counts) == set(range(N))  # nothing missing
        # Equal shares of 23 over 2 ranks: exactly one sample is padded (seen twice).
        assert sorted(counts.values()) == [1] * (N - 1) + [2]
        assert not set(per_rank[0][:11]) & set(per_rank[1][:11])  # disjoint before padding


def test_orders_differ_between_epochs(trained: Any) -> None:
    _, reports = trained
    for r in reports:
        assert r["epochs"][0] != r["epochs"][1]
        assert sorted(_samples(r["epochs"][0])) != _samples(r["epochs"][0])


def test_user_distributed_sampler_gets_set_epoch_with_one_notice(trained: Any) -> None:
    _, reports = trained
    for r in reports:
        e0, e1, e2 = r["user_sampler_epochs"]
        assert e0 != e1 and e1 != e2
        assert len(r["notices"]) == 1 and "set_epoch(1)" in r["notices"][0]
    a, b = (_samples(r["user_sampler_epochs"][0]) for r in reports)
    assert set(a) | set(b) == set(range(N))


# The elastic chain runs once, from the run with workers (indirect: one `trained` launch).
@pytest.mark.parametrize("trained", [2], indirect=True, ids=["workers2"])
def test_elastic_resume_2_to_1(trained: Any, resumed_at_1: Any) -> None:
    _, before = trained
    _, (after,) = resumed_at_1
    assert after["world_size"] == 1
    seen = _samples(before[0]["partial"]) + _samples(before[1]["partial"])
    assert len(seen) == 2 * 2 * BATCH
    rest = _samples(after["resumed"])
    counts = Counter(seen + rest)
    assert set(counts) == set(range(N)) and max(counts.values()) == 1  # none lost or repeated


@pytest.mark.parametrize("trained", [2], indirect=True, ids=["workers2"])
def test_elastic_resume_1_to_2(
    trained: Any, resumed_at_1: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out1, (single,) = resumed_at_1
    out = tmp_path_factory.mktemp("resume2")
    reports = launch(
        2, out, "resume", f"--samples={N}", f"--ckpt={out1 / 'ckpt.pt'}", "--workers=2", "--steps=0"
    )
    seen = _samples(single["partial"])
    assert len(seen) == 3 * BATCH
    rest = [_samples(r["resumed"]) for r in reports]
    assert len(rest[0]) == len(rest[1])  # equal steps after the resume too
    assert len(reports[0]["resumed"]) == len(reports[1]["resumed"])
    counts = Counter(seen + rest[0] + rest[1])
    assert set(counts) == set(range(N))
    # 14 samples left over 2 ranks: equal shares without padding, so nothing repeated.
    assert max(counts.values()) == 1


SHARD_SIZES = (7, 3, 9, 1, 5)  # 25 samples: two ranks need one padded sample


def _write_shards(directory: Path) -> None:
    from stoker.shards import build_index

    directory.mkdir()
    key = 0
    for number, size in enumerate(SHARD_SIZES):
        with tarfile.open(
            directory / f"part-{number:02d}.tar", "w", format=tarfile.USTAR_FORMAT
        ) as tar:
            for _ in range(size):
                data = str(key).encode()
                member = tarfile.TarInfo(f"{key:05d}.cls")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
                key += 1
    build_index(directory)


@pytest.mark.parametrize("workers", [0, 2])
def test_shard_stream_splits_by_rank_with_equal_steps(tmp_path: Path, workers: int) -> None:
    _write_shards(tmp_path / "shards")
    reports = launch(
        2, tmp_path / "out", "stream", f"--shards={tmp_path / 'shards'}", f"--workers={workers}"
    )
    total = sum(SHARD_SIZES)
    epochs = []
    for epoch in range(2):
        per_rank = [_samples(r["epochs"][epoch]) for r in reports]
        steps = [len(r["epochs"][epoch]) for r in reports]
        assert steps[0] == steps[1] == reports[0]["len"] == reports[1]["len"], steps
        assert len(per_rank[0]) == len(per_rank[1]) == 13
        counts = Counter(per_rank[0] + per_rank[1])
        assert set(counts) == set(range(total))  # every sample, on one rank or the other
        assert sorted(counts.values()) == [1] * (total - 1) + [2]  # one padded sample
        epochs.append(per_rank)
    assert epochs[0] != epochs[1]  # a new shard order each epoch


def test_fingerprint_mismatch_names_ranks_and_values(tmp_path: Path) -> None:
    reports = launch(2, tmp_path, "mismatch", "--samples=10")
    for r in reports:
        message = r.get("error", "")
        assert "dataset length: rank 0 = 10; rank 1 = 11" in message, message


def test_example_ddp_script_trains_and_resumes_at_another_world(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "ddp_train.py"
    ckpt = tmp_path / "ckpt.pt"

    def run(ranks: int, epochs: int) -> str:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            "--nnodes=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{_free_port()}",
            str(example),
            f"--epochs={epochs}",
            "--samples=128",
            f"--checkpoint={ckpt}",
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env, check=False
        )
        assert proc.returncode == 0, proc.stderr[-20000:]
        return proc.stdout

    assert "epoch 0: 2 steps per rank" in run(2, 1)  # 128 / 2 ranks / batch 32
    assert "epoch 1: 4 steps per rank" in run(1, 2)  # resumed at one rank
