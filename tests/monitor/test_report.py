"""The jsonl log round-trips through `stoker report` (summary, table, timeline PNG)."""

from __future__ import annotations

import argparse
import json

import pytest
from _monitor_synthetic import FakeClock, consume, producer

from stoker.errors import ConfigError
from stoker.monitor import Watch
from stoker.monitor import _report_cli as cli
from stoker.monitor._report import load_run, summarize
from stoker.monitor._sinks import SCHEMA_VERSION


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return cli.run(parser.parse_args(argv))


@pytest.fixture(scope="module")
def matplotlib_warm(tmp_path_factory):
    """Draw once before the leak check: matplotlib keeps its font files open for good."""
    from stoker.monitor._timeline import plot_timeline

    clock = FakeClock()
    path = tmp_path_factory.mktemp("warm") / "w.jsonl"
    consume(Watch(producer(clock, [0.01] * 30), clock=clock, progress=False, log=path), clock, 0.01)
    run = load_run(path)
    plot_timeline(run, summarize(run), path.with_suffix(".png"))


@pytest.fixture
def starved_log(tmp_path):
    waits = [0.5 if i == 150 else (0.030 if i % 4 == 3 else 0.0005) for i in range(240)]
    clock = FakeClock()
    path = tmp_path / "run.jsonl"
    w = Watch(producer(clock, waits), clock=clock, progress=False, every=50, log=path)
    consume(w, clock, 0.010)
    return path, w


def test_roundtrip_matches_live_summary(starved_log) -> None:
    path, w = starved_log
    live = w.summary()
    run = load_run(path)
    assert run.steps == 240 and run.every == 50 and len(run.intervals) == 5
    again = summarize(run)
    for name in ("steps", "samples", "verdict"):
        assert getattr(again, name) == getattr(live, name)
    for name in ("wait_s", "compute_s", "wait_fraction", "elapsed_s", "max_wait_s"):
        assert getattr(again, name) == pytest.approx(getattr(live, name), rel=1e-5)
    assert [e.step for e in again.stalls] == [e.step for e in live.stalls] == [150]
    assert again.sawtooth is not None and again.sawtooth.period == 4
    written = [json.loads(x) for x in path.read_text().splitlines()]
    assert written[0]["version"] == SCHEMA_VERSION
    assert written[-1]["kind"] == "summary"
    assert written[-1]["wait_fraction"] == pytest.approx(live.wait_fraction)


def test_cli_table_json_and_png(matplotlib_warm, starved_log, tmp_path, capsys) -> None:
    path, _ = starved_log
    png = tmp_path / "timeline.png"
    assert _run_cli([str(path), "-o", str(png)]) == 0
    out = capsys.readouterr().out
    assert "starved" in out and "every 4 steps" in out and "timeline written" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _run_cli([str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steps"] == 240 and data["sawtooth"]["period"] == 4


def test_two_epochs_and_two_watch_objects_concatenate(tmp_path) -> None:
    clock = FakeClock()
    path = tmp_path / "r.jsonl"
    w = Watch(producer(clock, [0.001] * 30), clock=clock, progress=False, log=path)
    consume(w, clock, 0.01)
    w.source = producer(clock, [0.001] * 20)
    consume(w, clock, 0.01)
    w2 = Watch(producer(clock, [0.002] * 10), clock=clock, progress=False, log=path)
    consume(w2, clock, 0.01)
    run = load_run(path)
    assert run.steps == 60 and len(run.headers) == 2 and run.epoch_starts == (30, 50)
    assert summarize(run).elapsed_s == pytest.approx(30 * 0.011 + 20 * 0.011 + 10 * 0.012)


def test_bad_logs(tmp_path, capsys) -> None:
    missing = tmp_path / "none.jsonl"
    assert _run_cli([str(missing)]) == 2
    assert "cannot read the log" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"
    other.write_text('{"kind":"header","schema":"something","version":1}\n')
    with pytest.raises(ConfigError, match="schema 'something'"):
        load_run(other)
    newer = tmp_path / "newer.jsonl"
    newer.write_text(
        f'{{"kind":"header","schema":"stoker.watch","version":{SCHEMA_VERSION + 1}}}\n'
    )
    with pytest.raises(ConfigError, match="upgrade stoker"):
        load_run(newer)
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"kind":"header","schema":"stoker.watch","version":1}\n')
    with pytest.raises(ConfigError, match="no steps"):
        load_run(empty)


def test_torn_last_line_is_ignored(starved_log) -> None:
    path, _ = starved_log
    text = path.read_text()
    path.write_text(text + '{"kind":"step","step":240,"t":1')
    assert load_run(path).steps == 240


def test_the_watch_times_its_own_bookkeeping() -> None:
    """``overhead_s`` is what the watch added between steps: with a real clock it is positive
    and a small part of the run; with a clock that only the test moves, it is zero."""
    import time

    from stoker.monitor import watch

    w = watch(range(2000), every=50, progress=False)
    t0 = time.perf_counter()
    for _ in w:
        pass
    elapsed = time.perf_counter() - t0
    own = w.summary().overhead_s
    assert 0 < own < elapsed
    clock = FakeClock()
    fake = Watch(producer(clock, [0.01] * 30), clock=clock, progress=False)
    consume(fake, clock, 0.01)
    assert fake.summary().overhead_s == 0.0
