"""What the user sees while training: a rich progress bar, or plain periodic lines.

* On a terminal (or in Jupyter with ``ipywidgets``): a rich progress bar with samples/s and
  data-wait %, redrawn at most ``REFRESH_HZ`` times a second (never per step), with each
  health line printed above it.
* Elsewhere (CI logs, ``nohup``, a pipe; Jupyter without ``ipywidgets``): one plain line per
  health interval and one at the end; nothing per step.
"""

# The detectors' thresholds are imported when the display first needs them (start-up of watch).

from __future__ import annotations

import importlib.util
import sys
from typing import IO, Protocol

from stoker.monitor._types import HealthReport, Verdict, WatchSummary

__all__ = ["REFRESH_HZ", "VERDICT_STYLE", "Display", "make_display"]

# Most progress-bar redraws per second.
REFRESH_HZ = 4.0
PREFIX = "[stoker.watch]"
#: The rich style of each verdict (the display's lines, ``stoker report``'s table).
VERDICT_STYLE: dict[Verdict, str] = {
    "healthy": "green",
    "mild": "yellow",
    "starved": "bold red",
    "short": "dim",
}


class Display(Protocol):
    """Receives progress at most ``REFRESH_HZ`` times a second and each health report."""

    def refresh(self, steps: int, rate: float | None, wait: float, steps_rate: float) -> None:
        """Show progress: steps done, samples/s (or ``None``), data-wait fraction, steps/s."""

    def health(self, report: HealthReport) -> None:
        """Show one health line."""

    def close(self, summary: WatchSummary | None) -> None:
        """Show the end of a pass."""


def _summary_line(summary: WatchSummary) -> str:
    rate = (
        f"{summary.samples_per_s:,.0f} samples/s"
        if summary.samples_per_s is not None
        else f"{summary.steps / max(summary.elapsed_s, 1e-9):,.1f} steps/s"
    )
    text = f"done: {summary.steps} steps in {summary.elapsed_s:.2f} s | {rate} | "
    text += f"{summary.verdict}: {summary.evidence} | {summary.diagnosis}"
    return text + (f" -> {summary.action}" if summary.action else "")


class NullDisplay:
    """Shows nothing (``progress=False``)."""

    def refresh(self, steps: int, rate: float | None, wait: float, steps_rate: float) -> None:
        pass

    def health(self, report: HealthReport) -> None:
        pass

    def close(self, summary: WatchSummary | None) -> None:
        pass


class PlainDisplay:
    """One line per health interval, for logs that are not terminals.

    Args:
        file: where lines go.
        total: steps in a pass, when known.
        console: a rich console to print through instead (Jupyter).
        first_step: the watch's step count when the pass began.
    """

    def __init__(
        self, file: IO[str], total: int | None, console: object = None, first_step: int = 0
    ) -> None:
        self._file = file
        self._total = total
        self._console = console
        self._first = first_step

    def _emit(self, text: str) -> None:
        if self._console is not None:
            self._console.print(text, markup=False, highlight=False)  # type: ignore[attr-defined]
        else:
            print(text, file=self._file, flush=True)

    def refresh(self, steps: int, rate: float | None, wait: float, steps_rate: float) -> None:
        pass

    def health(self, report: HealthReport) -> None:
        line = report.line()
        if self._total:  # the pass's progress; later passes also say the step in all
            done = f"{report.step - self._first}/{self._total}"
            shown = f"step {report.step} ({done} of the pass)" if self._first else f"step {done}"
            line = line.replace(f"step {report.step} ", f"{shown} ", 1)
        self._emit(f"{PREFIX} {line}")

    def close(self, summary: WatchSummary | None) -> None:
        if summary is not None and summary.steps:
            self._emit(f"{PREFIX} {_summary_line(summary)}")


class RichDisplay:
    """A rich progress bar with samples/s and data-wait %; health lines print above it.

    Args:
        console: the rich console to draw on.
        total: steps in a pass, when known.
        first_step: the watch's step count when the pass began (the bar counts this pass).
    """

    def __init__(self, console: object, total: int | None, first_step: int = 0) -> None:
        self._first = first_step
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns: list[object] = [TextColumn("[bold]stoker.watch")]
        if total:
            columns += [BarColumn(), MofNCompleteColumn()]
        else:
            columns += [TextColumn("{task.completed} steps")]
        columns += [
            TextColumn("{task.fields[rate]}"),
            TextColumn("data-wait [{task.fields[style]}]{task.fields[wait]}"),
            TimeElapsedColumn(),
        ]
        if total:
            columns.append(TimeRemainingColumn())
        self._progress = Progress(
            *columns,  # type: ignore[arg-type]
            console=console,  # type: ignore[arg-type]
            auto_refresh=False,
            transient=False,
        )
        self._task = self._progress.add_task("watch", total=total, rate="", wait="-", style="white")
        self._progress.start()

    def refresh(self, steps: int, rate: float | None, wait: float, steps_rate: float) -> None:
        from stoker.monitor._detect import HEALTHY_MAX_WAIT, STARVED_MIN_WAIT

        style = (
            "green"
            if wait < HEALTHY_MAX_WAIT
            else ("bold red" if wait >= STARVED_MIN_WAIT else "yellow")
        )
        shown = f"{rate:,.0f} samples/s" if rate is not None else f"{steps_rate:,.1f} steps/s"
        self._progress.update(
            self._task, completed=steps - self._first, rate=shown, wait=f"{wait:.0%}", style=style
        )
        self._progress.refresh()

    def health(self, report: HealthReport) -> None:
        self._progress.console.print(
            f"{PREFIX} {report.line()}", style=VERDICT_STYLE[report.verdict], markup=False
        )

    def close(self, summary: WatchSummary | None) -> None:
        self._progress.refresh()
        self._progress.stop()
        if summary is not None and summary.steps:
            self._progress.console.print(
                f"{PREFIX} {_summary_line(summary)}",
                style=VERDICT_STYLE[summary.verdict],
                markup=False,
            )


def make_display(
    progress: bool, total: int | None, file: IO[str] | None = None, first_step: int = 0
) -> Display:
    """Choose the display for this output stream.

    Args:
        progress: ``False`` shows nothing.
        total: steps in a pass, when known.
        file: the stream to write to. Default ``sys.stdout`` (looked up at call time).
        first_step: the watch's step count when this pass began: a pass's progress is counted
            from it (the steps of the watch count on across passes).

    Returns:
        A :class:`Display`.
    """
    if not progress:
        return NullDisplay()
    from rich.console import Console

    stream = file if file is not None else sys.stdout
    console = Console(file=stream)
    if console.is_jupyter:
        if importlib.util.find_spec("ipywidgets") is not None:
            return RichDisplay(console, total, first_step)
        return PlainDisplay(stream, total, console=console, first_step=first_step)
    if console.is_terminal:
        return RichDisplay(console, total, first_step)
    return PlainDisplay(stream, total, first_step=first_step)
