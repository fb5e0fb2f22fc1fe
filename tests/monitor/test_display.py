"""Output: plain periodic lines off a terminal, a rich bar on one, nothing with progress=False."""

from __future__ import annotations

import io
import re
import subprocess
import sys

from _monitor_synthetic import FakeClock, consume, producer
from rich.console import Console

from stoker.monitor import Watch
from stoker.monitor._display import RichDisplay


def test_plain_lines_when_stdout_is_a_pipe() -> None:
    code = "import stoker.monitor as m\nfor _ in m.watch(range(250), every=100): pass\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    lines = out.splitlines()
    assert [ln.split(" | ")[0] for ln in lines] == [
        "[stoker.watch] step 100/250",
        "[stoker.watch] step 200/250",
        "[stoker.watch] done: 250 steps in " + lines[2].split(" in ")[1].split(" | ")[0],
    ]
    assert "\x1b[" not in out  # no terminal escape codes in a log


def test_a_second_pass_counts_its_own_progress() -> None:
    """The watch's steps count on across passes; a pass's progress is its own (it read
    "step 300/250" in the second pass)."""
    code = (
        "import stoker.monitor as m\nw = m.watch(range(250), every=100)\n"
        "for _ in range(2):\n    for _ in w: pass\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    heads = [ln.split(" | ")[0] for ln in out.splitlines() if " done: " not in ln]
    assert heads == [
        "[stoker.watch] step 100/250",
        "[stoker.watch] step 200/250",
        "[stoker.watch] step 350 (100/250 of the pass)",
        "[stoker.watch] step 450 (200/250 of the pass)",
    ]


def test_plain_lines_with_capsys(capsys) -> None:
    clock = FakeClock()
    consume(Watch(producer(clock, [0.03] * 20), clock=clock, every=10), clock, 0.01)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0] == (
        "[stoker.watch] step 10 | 100 samples/s | data-wait 75% of step time: "
        "the iterable is slower than the step -> make the producer faster or parallel"
    )


def test_progress_false_is_silent(capsys) -> None:
    clock = FakeClock()
    consume(Watch(producer(clock, [0.01] * 20), clock=clock, every=5, progress=False), clock, 0.01)
    assert capsys.readouterr().out == ""


def test_rich_display_on_a_terminal() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=150)
    display = RichDisplay(console, total=40)
    clock = FakeClock()
    w = Watch(producer(clock, [0.02] * 40), clock=clock, every=20, progress=False)
    for i, _ in enumerate(w):
        clock.advance(0.01)
        if i == 19:
            display.refresh(20, 266.0, 0.67, 66.0)
    display.health(w.reports[0])
    display.close(w.summary())
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue())
    assert "stoker.watch" in text and "266 samples/s" in text and "67%" in text
    assert "data-wait 67% of step time" in text and "done: 40 steps" in text
