"""``--plot out.png``: a bar chart of each contender's throughput relative to torch's best.

Needs matplotlib (the ``bench`` extra: ``pip install 'stoker[bench]'``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from stoker.bench._result import BenchResult, ContenderResult, WorkloadResult
from stoker.bench._roles import ROLES_EXPLAINED, role_label
from stoker.errors import ConfigError

__all__ = ["plot"]

# The footnote: characters of 7-point text per inch of width, and inches per line.
FOOT_CHARS_PER_INCH = 17
FOOT_LINE_IN = 0.14
# Legend entries per row (six series in one row overflow the figure).
LEGEND_COLUMNS = 3

# (role, legend label, colour); one bar per role per workload. The labels use the table's
# words for the roles (`_roles.ROLE_TEXT`), explained by `_roles.ROLES_EXPLAINED` below the plot.
_SERIES = (
    ("torch-nw0", role_label("torch", "torch-nw0"), "#c7c7c7"),
    ("torch-recommended", role_label("torch", "torch-recommended"), "#9ecae1"),
    ("torch-same", role_label("torch", "torch-same"), "#4292c6"),
    ("optional", "best other library", "#fdae6b"),
    ("stoker", role_label("stoker", "stoker"), "#d94801"),
    ("stoker-auto", role_label("stoker", "stoker-auto"), "#7f2704"),
)
_STOKER_ROLES = ("stoker", "stoker-auto")


def _pick(w: WorkloadResult, role: str) -> ContenderResult | None:
    """The contender shown for ``role``: the only one, or for the other libraries (SPDL,
    torchdata.nodes, each at its grid's best) the fastest of them."""
    found = [c for c in w.contenders if role in c.roles and c.ok]
    if role == "optional" and len(found) > 1:
        return max(found, key=lambda c: w.ratio_to_best(c) or 0.0)
    return found[0] if found else None


def _series_bars(
    ax: Any, workloads: list[WorkloadResult], k: int, width: float, serie: tuple[str, str, str]
) -> float:
    """One role's bars (median ratio to torch's best, whiskers over the repeats); the top."""
    role, label, colour = serie
    xs, ys, lo, hi = [], [], [], []
    for i, w in enumerate(workloads):
        c = _pick(w, role)
        r = w.ratio_to_best(c) if c is not None else None
        best = w.torch_best
        if r is not None and c is not None and best is not None and best.samples_per_s:
            rates = [run.samples_per_s / best.samples_per_s for run in c.runs]
            xs.append(i - 0.4 + width * (k + 0.5))
            ys.append(r)
            lo.append(max(0.0, r - min(rates)))
            hi.append(max(0.0, max(rates) - r))
    ax.bar(
        xs,
        ys,
        width * 0.92,
        yerr=[lo, hi],
        error_kw={"elinewidth": 0.8, "capsize": 2, "ecolor": "#555555"},
        label=label,
        color=colour,
        edgecolor="#444444" if role in _STOKER_ROLES else "none",
        linewidth=0.6,
    )
    top = max([1.0, *(y + h for y, h in zip(ys, hi, strict=True))])
    if role in _STOKER_ROLES:
        for x, y, h in zip(xs, ys, hi, strict=True):
            ax.text(
                x,
                y + h + 0.02 * top,
                f"{y:.2f}x",
                ha="center",
                va="bottom",
                fontsize=9,
                fontweight="bold",
                zorder=5,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1, "alpha": 0.85},
            )
    return top


def _mark_failures(ax: Any, workloads: list[WorkloadResult], width: float) -> None:
    for i, w in enumerate(workloads):
        st = next((c for c in w.contenders if "stoker" in c.roles), None)
        if st is not None and not st.ok:
            ax.text(
                i + 0.4 - width / 2,
                0.05,
                "stoker\nfailed",
                ha="center",
                va="bottom",
                fontsize=8,
                color="#d94801",
                rotation=90,
            )


def _axes(ax: Any, result: BenchResult, workloads: list[WorkloadResult], top: float) -> None:
    ax.axhline(1.0, color="#222222", linestyle="--", linewidth=1.2)
    ax.text(
        1.005,
        1.0,
        "torch's\nbest",
        transform=ax.get_yaxis_transform(),
        va="center",
        ha="left",
        fontsize=8,
        color="#222222",
    )
    ax.set_xticks(range(len(workloads)))
    best_names = [w.torch_best.name if w.torch_best else "" for w in workloads]
    ax.set_xticklabels(
        [
            f"{w.name}\n(best: {b.removeprefix('torch ')})"
            for w, b in zip(workloads, best_names, strict=True)
        ],
        fontsize=9,
    )
    ax.set_xlim(-0.6, len(workloads) - 0.4)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("samples/s relative to torch's best config\n(higher is better)")
    m = result.machine
    mode = "quick" if result.quick else "full"
    ax.set_title(
        "stoker bench: data-loading throughput vs torch's best DataLoader configuration\n"
        f"{m.get('usable_cores', '?')} cores, torch {m.get('torch', '?')}, {mode} mode, "
        f"medians of {result.repeats} runs",
        fontsize=11,
    )
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _footer(fig: Any) -> None:
    fig_w, fig_h = fig.get_size_inches()
    foot = [
        "bars: medians; whiskers: range of the repeats (each run / torch's best median)",
        *textwrap.wrap(ROLES_EXPLAINED, width=int(fig_w * FOOT_CHARS_PER_INCH)),
    ]
    fig.set_size_inches(fig_w, fig_h + FOOT_LINE_IN * len(foot))
    fig.text(0.01, 0.01, "\n".join(foot), fontsize=7, color="#666666")
    fig.tight_layout(rect=(0, FOOT_LINE_IN * (len(foot) + 0.5) / fig.get_size_inches()[1], 1, 1))


def plot(result: BenchResult, path: str | Path) -> Path:
    """Draw the chart and save it as a PNG.

    Args:
        result: a bench result.
        path: where to write the PNG.

    Returns:
        The path written.

    Raises:
        ConfigError: if matplotlib is not installed or no workload has results.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("`--plot` needs matplotlib: `pip install 'stoker[bench]'`.") from exc
    workloads = [w for w in result.workloads if w.torch_best is not None]
    if not workloads:
        raise ConfigError("nothing to plot: no workload has a torch result.")
    series = [s for s in _SERIES if any(_pick(w, s[0]) for w in workloads)]
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(8.0, 1.6 * len(workloads) + 3), 5.6), dpi=120)
    top = max(
        [1.0, *(_series_bars(ax, workloads, k, width, serie) for k, serie in enumerate(series))]
    )
    _mark_failures(ax, workloads, width)
    _axes(ax, result, workloads, top)
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        fontsize=8,
        frameon=False,
        ncol=min(len(series), LEGEND_COLUMNS),
    )
    _footer(fig)
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
