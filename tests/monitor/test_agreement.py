"""`stoker.watch` and `stoker report` give one run the same figures and the same verdict.

Each case drives a watch over a synthetic timeline (fake clock), logs it, and reads the log
back as `stoker report` does: steps, wall time, throughput, start-up, the steady-state
data-wait fraction, the verdict with its evidence, the diagnosis and the action must agree,
and the done line and the report's table must print the same wall time and throughput.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from _monitor_synthetic import FakeClock, SlowStart, consume

from stoker.cli import main
from stoker.monitor import Watch, WatchSummary
from stoker.monitor._figures import SHORT_RUN_STEPS
from stoker.monitor._report import load_run, summarize


@dataclass(frozen=True)
class Timeline:
    iter_s: float  # iter()'s own time (workers starting)
    waits: list[float]  # per step, the time next() blocks
    compute_s: float  # per step, the training step


SLOW_START = Timeline(0.020, [0.060] + [0.00004] * 127, 0.002)
CASES = {
    # healthy once the pipeline has filled: start-up alone would have called it starved
    "healthy-slow-start": SLOW_START,
    "starved": Timeline(0.001, [0.003] * 200, 0.001),
    "stalls": Timeline(
        0.001, [0.5 if i in {60, 130, 200, 270} else 0.0002 for i in range(300)], 0.02
    ),
    "short": Timeline(0.030, [0.040] + [0.0001] * 4, 0.002),
}
VERDICTS = {"healthy-slow-start": "healthy", "starved": "starved", "stalls": "starved"}


def watch_and_report(case: Timeline, tmp_path, capsys) -> tuple[WatchSummary, WatchSummary, str]:
    """(the watch's summary, the report's, what the watch printed)."""
    clock = FakeClock()
    log = tmp_path / "run.jsonl"
    w = Watch(SlowStart(clock, case.iter_s, case.waits), clock=clock, every=50, log=log)
    consume(w, clock, case.compute_s)
    printed = capsys.readouterr().out
    return w.summary(), summarize(load_run(log)), printed


@pytest.mark.parametrize("name", list(CASES))
def test_watch_and_report_agree(name: str, tmp_path, capsys) -> None:
    case = CASES[name]
    live, report, printed = watch_and_report(case, tmp_path, capsys)
    assert report.steps == live.steps == len(case.waits)
    assert report.samples == live.samples == 4 * len(case.waits)
    wall = case.iter_s + sum(case.waits) + case.compute_s * len(case.waits)
    for figure in ("elapsed_s", "samples_per_s", "startup_s", "wait_fraction"):
        assert getattr(report, figure) == pytest.approx(getattr(live, figure), rel=1e-5), figure
    assert live.elapsed_s == pytest.approx(wall)
    assert live.startup_s == pytest.approx(case.iter_s + case.waits[0])
    steady = case.waits[1:]
    want = sum(steady) / (sum(steady) + case.compute_s * len(steady))
    assert live.wait_fraction == pytest.approx(want)
    for said in ("verdict", "evidence", "diagnosis", "action", "steady_steps"):
        assert getattr(report, said) == getattr(live, said), said
    assert [e.step for e in report.stalls] == [e.step for e in live.stalls]
    if live.verdict in ("healthy", "short"):
        assert live.action is None  # no advice against the verdict
    # the same figures, printed the same way by both commands
    done = next(line for line in printed.splitlines() if " done: " in line)
    assert main(["report", str(tmp_path / "run.jsonl")]) == 0
    table = capsys.readouterr().out
    assert f"{live.steps} steps in {live.elapsed_s:.2f} s" in done
    assert f"{live.elapsed_s:,.2f} s" in table
    assert f"{live.samples_per_s:,.0f} samples/s" in done
    assert f"{live.samples_per_s:,.0f} samples/s" in table
    assert live.evidence in done and live.evidence in table


@pytest.mark.parametrize("name", list(VERDICTS))
def test_each_timeline_gets_its_verdict(name: str, tmp_path, capsys) -> None:
    live, _, _ = watch_and_report(CASES[name], tmp_path, capsys)
    assert live.verdict == VERDICTS[name]


def test_start_up_is_reported_and_does_not_decide_the_verdict(tmp_path, capsys) -> None:
    live, _, printed = watch_and_report(SLOW_START, tmp_path, capsys)
    whole_run = live.wait_s / (live.wait_s + live.compute_s)
    assert whole_run > 0.15  # what the verdict was judged on before: "starved"
    assert live.verdict == "healthy" and live.action is None
    assert live.evidence == "steady state: waits 0.04 ms of 2.0 ms per step (2%); start-up 80 ms"
    assert "not the bottleneck" in printed.splitlines()[-1]
    assert "set `num_workers`" not in printed and "->" not in printed.splitlines()[-1]


def test_stalls_are_found_at_the_same_steps(tmp_path, capsys) -> None:
    live, report, _ = watch_and_report(CASES["stalls"], tmp_path, capsys)
    assert [e.step for e in live.stalls] == [e.step for e in report.stalls] == [60, 130, 200, 270]


def test_a_short_run_is_not_judged(tmp_path, capsys) -> None:
    live, report, printed = watch_and_report(CASES["short"], tmp_path, capsys)
    assert live.steady_steps == 4 < SHORT_RUN_STEPS
    assert live.verdict == report.verdict == "short" and live.action is None
    assert "too short to judge" in printed
    assert main(["report", "--json", str(tmp_path / "run.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "short"


def test_two_passes_each_have_a_start_up(tmp_path, capsys) -> None:
    clock = FakeClock()
    log = tmp_path / "run.jsonl"
    w = Watch(SlowStart(clock, 0.010, [0.030] + [0.001] * 29), clock=clock, log=log)
    consume(w, clock, 0.009)
    w.source = SlowStart(clock, 0.010, [0.030] + [0.001] * 19)
    consume(w, clock, 0.009)
    live, report = w.summary(), summarize(load_run(log))
    assert live.steady_steps == report.steady_steps == 48
    assert live.startup_s == pytest.approx(2 * 0.040) and report.startup_s == pytest.approx(0.080)
    assert live.wait_fraction == pytest.approx(0.1) and report.wait_fraction == pytest.approx(0.1)
    assert report.elapsed_s == pytest.approx(live.elapsed_s) == pytest.approx(0.02 + 0.108 + 0.45)


def test_an_interval_of_only_the_first_step_says_start_up(capsys) -> None:
    clock = FakeClock()
    w = Watch(SlowStart(clock, 0.010, [0.016, 0.001, 0.001]), clock=clock, every=1)
    consume(w, clock, 0.009)
    first = capsys.readouterr().out.splitlines()[0]
    assert w.reports[0].verdict == "short" and w.reports[0].action is None
    assert first.endswith("| start-up only: first batch after 26 ms"), first
