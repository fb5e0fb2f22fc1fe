"""How a diagnosis is shown: rich text for a terminal, or JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TextIO

from stoker.doctor._finding import Diagnosis, Severity

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["render_json", "render_text"]

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_MARK = {Severity.ERROR: "✖", Severity.WARNING: "▲", Severity.INFO: "●"}


def _mib(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:,.1f} {unit}"
    return f"{n:,} B"


def _summary_of_facts(facts: dict[str, Any]) -> list[str]:
    parts = []
    workers = facts.get("num_workers")
    if workers is not None:
        line = f"{workers} worker{'' if workers == 1 else 's'} ({facts.get('start_method')})"
        if facts.get("batch_size") is not None:
            line += f", batch {facts['batch_size']}"
        if facts.get("prefetch_factor"):
            line += f", prefetch {facts['prefetch_factor']}"
        parts.append(line)
    if "sample_ms_median" in facts:
        parts.append(
            f"{facts['samples_read']} samples read: median {facts['sample_ms_median']:,.2f} ms, "
            f"slowest {facts['sample_ms_max']:,.2f} ms"
        )
    if facts.get("batch_bytes"):
        parts.append(f"batch {_mib(facts['batch_bytes'])}")
    if "usable_cores" in facts:
        parts.append(f"{facts['usable_cores']} usable cores")
    if facts.get("shm_free_bytes") is not None:
        parts.append(f"{facts.get('shm_dir')} {_mib(facts['shm_free_bytes'])} free")
    for entry in facts.get("measured_worker_growth") or []:
        parts.append(
            f"forked worker +{_mib(entry['uss_growth_bytes'])} private after "
            f"{entry['samples_read']} samples"
        )
    return parts


def render_text(
    diagnosis: Diagnosis,
    file: TextIO | None = None,
    *,
    color: bool | None = None,
    console: Console | None = None,
) -> None:
    """Print the diagnosis for a human: context line, one block per finding, summary.

    Args:
        diagnosis: what to print.
        file: where to print. Default: standard output.
        color: force colour on or off. Default: rich's detection (a terminal gets colour).
        console: print on this console instead (``file`` and ``color`` are then ignored).
    """
    from rich.console import Console
    from rich.padding import Padding
    from rich.syntax import Syntax
    from rich.text import Text

    if console is None:
        console = Console(file=file, no_color=color is False, force_terminal=color, highlight=False)
    console.print(Text.assemble(("stoker doctor ", "bold"), (diagnosis.target, "bold cyan")))
    for part in _summary_of_facts(diagnosis.facts):
        console.print(Text(f"  {part}", style="dim"))
    console.print()
    for f in diagnosis.findings:
        style = _STYLE[f.severity]
        head = Text.assemble(
            (f"{_MARK[f.severity]} {f.code} {f.severity.value}", style), "  ", (f.title, "bold")
        )
        console.print(head)
        if f.location:
            console.print(Text(f"    at {f.location}", style="dim"))
        console.print(
            Padding(Text.assemble(("observed  ", "bold"), f.observed), (0, 0, 0, 4), expand=False)
        )
        console.print(
            Padding(Text.assemble(("why       ", "bold"), f.why), (0, 0, 0, 4), expand=False)
        )
        console.print(Padding(Text("fix", style="bold"), (0, 0, 0, 4), expand=False))
        console.print(
            Padding(Syntax(f.fix, "python", theme="ansi_dark", word_wrap=True), (0, 0, 0, 6))
        )
        console.print()
    counts = {s: diagnosis.count(s) for s in Severity}
    if not diagnosis.findings:
        console.print(Text("✔ no problems found", style="bold green"))
    else:
        console.print(
            Text.assemble(
                (f"{counts[Severity.ERROR]} error(s)", _STYLE[Severity.ERROR]),
                ", ",
                (f"{counts[Severity.WARNING]} warning(s)", _STYLE[Severity.WARNING]),
                ", ",
                (f"{counts[Severity.INFO]} info", _STYLE[Severity.INFO]),
                f"  (`stoker doctor --explain {diagnosis.findings[0].code}` explains a code)",
            )
        )


def render_json(diagnosis: Diagnosis, file: TextIO) -> None:
    """Write the diagnosis as one JSON document (see :meth:`Diagnosis.to_dict`)."""
    json.dump(diagnosis.to_dict(), file, indent=2, default=str)
    file.write("\n")
