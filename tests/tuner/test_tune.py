"""stoker tune: the factored search (probe, halving over workers, prefetch), plain successive
halving over a given space, the stoker.toml it writes, and its command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import stoker
from stoker.loader._config import load_config
from stoker.tuner import _tune as tune_mod
from stoker.tuner._tune import Candidate, candidates, tune

from .tune_factories import Squares

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def short_rounds(monkeypatch):
    monkeypatch.setattr(tune_mod, "FIRST_ROUND_S", 0.15)


def test_space_covers_both_backends_and_stays_within_four_workers_per_core():
    space = candidates(cores=2)
    assert {c.backend for c in space} == {"process", "thread"}
    assert max(c.num_workers for c in space) == 8
    assert all(not c.pin_memory for c in space)
    assert any(c.pin_memory for c in candidates(cores=2, device="cuda"))


def test_threads_that_cover_waits_climb_to_sixteen_per_core_at_most_sixty_four():
    assert tune_mod.worker_counts(2) == [1, 2, 3, 4, 6, 8]
    assert tune_mod.worker_counts(2, waits=True)[-3:] == [16, 24, 32]
    assert tune_mod.worker_counts(8, waits=True)[-1] == 64


def test_halving_keeps_the_faster_half_and_writes_the_winner(tmp_path):
    space = [Candidate("thread", 1, 2), Candidate("process", 1, 2), Candidate("thread", 2, 2)]
    out = tmp_path / "stoker.toml"
    result = tune(Squares(), 32, budget_s=30, output=out, space=space)
    first_round = result.rounds[0][1]
    # 3 candidates -> 1 survivor: the search ends without re-measuring a lone survivor.
    assert len(result.rounds) == 1 and len(first_round) == 3
    assert (result.best, result.best_rate) == tune_mod.pick(first_round)
    assert result.baseline_rate > 0 and result.best_rate > 0
    settings = load_config(out)
    assert settings["backend"] == result.best.backend
    assert settings["num_workers"] == result.best.num_workers
    assert "torch's DataLoader defaults" in out.read_text()
    loader = stoker.DataLoader(Squares(), batch_size=32, config=out)
    assert loader.num_workers == result.best.num_workers


def test_the_winner_is_the_cheapest_configuration_within_the_noise_of_the_fastest():
    pick = tune_mod.pick
    two, four = Candidate("process", 2, 2), Candidate("process", 4, 2)
    # 4 workers 3% faster than 2: noise; 2 win. 10% faster: 4 win.
    assert pick([(four, 103.0), (two, 100.0)]) == (two, 100.0)
    assert pick([(four, 110.0), (two, 100.0)]) == (four, 110.0)
    # At one count: shallower prefetch, then threads over processes.
    deep, thread = Candidate("process", 2, 4), Candidate("thread", 2, 2)
    assert pick([(deep, 101.0), (two, 100.0)]) == (two, 100.0)
    assert pick([(two, 101.0), (thread, 100.0)]) == (thread, 100.0)
    # Loading in the main process is preferred last (in training it does not overlap).
    main = Candidate("process", 0, 2)
    assert pick([(main, 101.0), (four, 100.0)]) == (four, 100.0)
    assert pick([(main, 200.0), (four, 100.0)]) == (main, 200.0)
    with pytest.raises(ValueError):
        pick([])


@pytest.mark.measures  # the climb stops where the measured rate stops improving
def test_default_search_probes_the_backend_then_halves_worker_counts_then_prefetch():
    result = tune(Squares(), 32, budget_s=60, output=None)
    assert result.notes and result.notes[0].startswith("backend=")
    backend = result.notes[0].split(":")[0].removeprefix("backend=")
    first = [c for c, _ in result.rounds[0][1]]
    counts = sorted(c.num_workers for c in first)
    # The main process, then a climb through the counts (it may stop early, never skip one).
    assert counts == [0, 1, 2, 3, 4, 6, 8][: len(counts)] and len(counts) >= 3
    assert {c.backend for c in first if c.num_workers} == {backend}
    assert {c.prefetch_factor for c in first} == {2}
    last = [c for c, _ in result.rounds[-1][1]]
    if any(c.prefetch_factor == 4 for c in last):
        # The prefetch round: the winning count with each prefetch_factor.
        assert {c.prefetch_factor for c in last} == {2, 4}
        assert len({(c.backend, c.num_workers) for c in last}) == 1
    else:  # the climb's best re-run (a winner without workers has no prefetch round)
        assert len(result.rounds) <= 2 or result.best.num_workers == 0
    assert result.best in last


def test_threads_covering_waits_start_the_climb_where_they_keep_one_core_busy():
    counts = tune_mod.worker_counts(2, waits=True)
    # 77% waits: 1 / 0.23 = 4.3 threads keep one core busy -> the climb starts at 4.
    assert tune_mod.climb_start(2, 0.77, counts) == 4
    # 30% waits: 1.4 -> 1; 60%: 2.5 -> 2.
    assert tune_mod.climb_start(2, 0.30, counts) == 1
    assert tune_mod.climb_start(2, 0.60, counts) == 2
    # Nearly all waiting: capped at 2 x cores (contention among threads is not estimated).
    assert tune_mod.climb_start(2, 0.99, counts) == 4
    assert tune_mod.climb_start(16, 0.99, tune_mod.worker_counts(16, waits=True)) == 32
    assert tune_mod.climb_start(2, 1.0, counts) == 4 and tune_mod.climb_start(2, -1, counts) == 1


@pytest.mark.measures  # the backend probe decides from timings of this machine
def test_threads_covering_waits_skip_the_main_process_and_the_counts_below_the_start():
    from .tune_factories import Sleepy

    result = tune(Sleepy(), 4, budget_s=10, output=None)
    # Samples that sleep 90% of their time: threads, to cover the waits.
    assert result.notes[0].startswith("backend=thread"), result.notes
    skipped = result.notes[1]
    # The start depends on the wait share measured (90% on a quiet machine: 4 threads on 2
    # cores; a loaded one queues the woken threads and reads less).
    found = re.match(r"not measured: the main process and fewer than (\d+) threads", skipped)
    assert found is not None and int(found.group(1)) >= 2, skipped
    start = int(found.group(1))
    first = [c for c, _ in result.rounds[0][1]]
    counts = sorted(c.num_workers for c in first)
    expected = [n for n in tune_mod.worker_counts(2, waits=True) if n >= start]
    assert counts == expected[: len(counts)] and len(counts) >= 2
    assert result.best.num_workers >= start and result.baseline_rate > 0


@pytest.mark.measures  # the backend probe decides from timings of this machine
def test_processes_for_slow_cpu_batches_skip_the_main_process():
    from .tune_factories import Busy

    # 16 samples of 1 ms: a 16-ms batch, longer than MAIN_PROCESS_MAX_BATCH_S.
    result = tune(Busy(), 16, budget_s=10, output=None)
    assert result.notes[0].startswith("backend=process"), result.notes
    assert result.notes[1].startswith("not measured: the main process (a batch takes")
    counts = sorted(c.num_workers for c, _ in result.rounds[0][1])
    assert counts == [1, 2, 3, 4, 6, 8][: len(counts)] and len(counts) >= 2
    assert result.baseline_rate > 0  # torch's defaults, in the main process, still measured


def test_loading_in_the_main_process_is_a_candidate_and_configures_cleanly(tmp_path):
    cand = Candidate("process", 0, 2)
    assert cand.label == "main process nw=0"
    assert cand.settings() == {"num_workers": 0, "pin_memory": False}
    result = tune(Squares(), 32, budget_s=30, output=tmp_path / "s.toml", space=[cand])
    assert result.best == cand and result.best_rate > 0
    loader = stoker.DataLoader(Squares(), batch_size=32, config=tmp_path / "s.toml")
    assert loader.num_workers == 0 and len(list(loader)) == 16


def test_budget_stops_the_search_early(tmp_path):
    space = [Candidate("thread", n, 2) for n in (1, 2, 3, 4)]
    result = tune(Squares(), 32, budget_s=0.1, output=None, space=space)
    assert len(result.rounds) == 1 and result.config_path is None


def test_bad_arguments_are_clear():
    with pytest.raises(stoker.ConfigError, match="batch_size"):
        tune(Squares(), 0)
    with pytest.raises(stoker.ConfigError, match="map-style"):
        tune(iter([]), 4)  # type: ignore[arg-type]


def test_command_line_writes_stoker_toml(tmp_path):
    out = tmp_path / "stoker.toml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stoker",
            "tune",
            "tests.tuner.tune_factories:make_dataset",
            "-b",
            "64",
            "--budget",
            "8",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=HERE.parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
    assert "best:" in proc.stdout and "torch's DataLoader" in proc.stdout
    config = load_config(out)
    # Loading 16 floats a sample in the main process may win on two cores: no backend then.
    if config["num_workers"] == 0:
        assert "backend" not in config and "prefetch_factor" not in config, config
    else:
        assert config["backend"] in ("process", "thread"), config


def test_a_session_times_several_worker_counts_in_one_loader_and_leaves_nothing_behind():
    import psutil

    from stoker.tuner._measure import WorkerSession

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    session = WorkerSession(Squares(), 32, "process", 1, 2)
    try:
        for workers, prefetch in ((1, 2), (3, 2), (2, 4)):
            assert session.rate(workers, prefetch, 0.05) > 0
            it = session._it
            assert session._scaler.running(it._pool) == workers and it._prefetch == prefetch
    finally:
        session.close()
    psutil.wait_procs(
        [p for p in psutil.Process().children(recursive=True) if p.pid not in before], timeout=10
    )
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.measures  # the share comes from the spans sampled in a 0.5 s run
def test_a_session_measures_how_much_its_process_workers_block():
    from stoker.autotune._controller import workers_to_fill
    from stoker.tuner._measure import WorkerSession

    from .tune_factories import Sleepy

    session = WorkerSession(Sleepy(), 4, "process", 2, 2)
    try:
        session.rate(2, 2, 0.5)
        need = session.fill_need()
    finally:
        session.close()
    # Samples that sleep 90% of their time: far more workers than the 2 cores fill them.
    assert need is not None and need >= workers_to_fill(2, 0.5)


def test_cli_checks_the_output_path_before_measuring(capsys):
    from stoker.cli import main

    assert main(["tune", "no_such_module_xyz:f", "-b", "4", "-o", "/nonexistent-dir/s.toml"]) == 2
    err = capsys.readouterr().err
    assert "`--output /nonexistent-dir/s.toml`" in err and "does not exist" in err
