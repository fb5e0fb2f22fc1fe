"""The jsonl log round-trips through `stoker report` (summary, table, timeline PNG)."""

from __future__ import annotations

import json

import pytest
from _monitor_synthetic import FakeClock, consume, producer

from stoker.cli import main
from stoker.errors import ConfigError
from stoker.monitor import Watch
from stoker.monitor._report import load_run, summarize
from stoker.monitor._sinks import SCHEMA_VERSION


def _run_cli(argv: list[str]) -> int:
    """`stoker report ARGV` through the command's entry point (usage errors: status 2)."""
    return main(["report", *argv])


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


# -- a log is untrusted input ------------------------------------------------------------------

_HEADER = '{"kind":"header","schema":"stoker.watch","version":1,"every":10,"num_workers":2}'
_STEP = '{"kind":"step","step":0,"t":0.0,"wait_s":0.01,"compute_s":0.02,"size":4}'

# case -> (the lines after the header, the line number blamed, what the message names)
MALICIOUS = {
    "t-not-a-number": (['{"kind":"step","t":"abc","wait_s":0.1,"compute_s":0.1}'], 2, "`t`"),
    "t-nan": (['{"kind":"step","t":NaN,"wait_s":0.1,"compute_s":0.1}'], 2, "`t`"),
    "wait-infinite": ([_STEP, '{"kind":"step","t":1,"wait_s":Infinity,"compute_s":0}'], 3, "wait"),
    "wait-negative": (['{"kind":"step","t":0,"wait_s":-1,"compute_s":0}'], 2, "`wait_s`"),
    "compute-bool": (['{"kind":"step","t":0,"wait_s":0,"compute_s":true}'], 2, "`compute_s`"),
    "compute-missing": (['{"kind":"step","t":0,"wait_s":0}'], 2, "`compute_s`"),
    "size-str": (['{"kind":"step","t":0,"wait_s":0,"compute_s":0,"size":"4"}'], 2, "`size`"),
    "interval-step-markup": ([_STEP, '{"kind":"interval","step":"[/oops]"}'], 3, "[/oops]"),
    "epoch-step-str": ([_STEP, '{"kind":"epoch","epoch":1,"step":"x"}'], 3, "`step`"),
    "loader-backend-markup": (
        [_STEP, '{"kind":"interval","step":1,"loader":{"backend":"[red]x[/red]"}}'],
        3,
        "`loader.backend`",
    ),
    "loader-fraction": (
        [_STEP, '{"kind":"interval","step":1,"loader":{"busy_fraction":5}}'],
        3,
        "`loader.busy_fraction`",
    ),
    "loader-pss": (
        [_STEP, '{"kind":"interval","step":1,"loader":{"pss_bytes":"x"}}'],
        3,
        "`loader.pss_bytes`",
    ),
    "loader-not-object": ([_STEP, '{"kind":"interval","step":1,"loader":[1]}'], 3, "`loader`"),
}


@pytest.mark.parametrize("case", list(MALICIOUS))
def test_a_bad_record_is_an_error_naming_its_line(case, tmp_path, capsys) -> None:
    lines, lineno, names = MALICIOUS[case]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([_HEADER, *lines]) + "\n")
    with pytest.raises(ConfigError) as info:
        load_run(path)
    assert f"{path}:{lineno}:" in str(info.value) and names in str(info.value)
    assert _run_cli([str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"bad.jsonl:{lineno}:" in err


def test_a_header_field_of_the_wrong_type_is_an_error(tmp_path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(_HEADER.replace('"num_workers":2', '"num_workers":"[red]x[/red]"') + "\n")
    with pytest.raises(ConfigError, match=r"h.jsonl:1: .*`num_workers`"):
        load_run(path)
    path.write_text(_HEADER.replace('"version":1', '"version":true') + "\n" + _STEP + "\n")
    with pytest.raises(ConfigError, match="`version` must be an int"):
        load_run(path)


def test_bytes_that_are_not_utf8_are_an_error_naming_the_line(tmp_path) -> None:
    path = tmp_path / "binary.jsonl"
    path.write_bytes((_HEADER + "\n" + _STEP + "\n").encode() + b"\xff\xfe\x00\n")
    with pytest.raises(ConfigError, match=r"binary.jsonl:3: .*not UTF-8"):
        load_run(path)
    path.write_bytes((_HEADER + "\n" + _STEP + "\n").encode() + '{"t":"é'.encode()[:-1])
    assert load_run(path).steps == 1  # torn mid-character by a killed run: kept up to there


def test_strings_are_printed_as_text_not_markup(tmp_path, capsys) -> None:
    """A path with rich markup in it is printed as is: `[/oops]` would raise MarkupError and
    `[red]...[/red]` would vanish into a colour."""
    folder = tmp_path / "[link=https:example.com]x["  # with the next: `x[/oops]`
    (folder / "oops][red]run[").mkdir(parents=True)
    path = folder / "oops][red]run[" / "red].jsonl"  # `[red]run[/red].jsonl`
    path.write_text("\n".join([_HEADER, _STEP, _STEP.replace('"t":0.0', '"t":0.03')]) + "\n")
    assert "[/oops][red]run[/red].jsonl" in str(path)
    assert _run_cli([str(path)]) == 0
    out = capsys.readouterr().out
    assert "x[/oops][red]run[/red].jsonl" in out and "[link=https:example.com]" in out


def test_a_bench_result_is_named_for_what_it_is(tmp_path, capsys) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema": "stoker.bench/1", "workloads": []}, indent=2))
    with pytest.raises(ConfigError, match=r"is a `stoker bench` result .*not a `stoker.watch` log"):
        load_run(path)
    doctor = tmp_path / "doctor.json"
    doctor.write_text(json.dumps({"target": "x.py", "findings": []}, indent=2))
    with pytest.raises(ConfigError, match="is a `stoker doctor --json` report"):
        load_run(doctor)
    assert _run_cli([str(path)]) == 2
    assert "invalid JSON" not in capsys.readouterr().err
