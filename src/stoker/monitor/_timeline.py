"""The timeline plot of ``stoker report -o timeline.png``.

Four panels, top to bottom, all against the step index:

1. every step as a stacked bar: data wait (red) under compute (blue), stalls marked with a
   red triangle, epoch starts with a dashed line (long runs are binned: mean per bin, with
   the bin's worst wait drawn as a thin red line so spikes survive);
2. a zoom on ``ZOOM_STEPS`` consecutive steps (around the sawtooth or the worst stall), where
   the pattern of individual steps is visible;
3. the data-wait share of step time (rolling), over green / amber / red bands;
4. throughput (samples/s, or steps/s without batch sizes), rolling.

The title states the verdict in words and colour, so the picture reads without the numbers.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from stoker.monitor._detect import HEALTHY_MAX_WAIT, STALL_WARMUP_STEPS, STARVED_MIN_WAIT
from stoker.monitor._report import RunLog, find_stalls
from stoker.monitor._types import WatchSummary

__all__ = ["ZOOM_STEPS", "plot_timeline"]

# Steps drawn one bar each before the full-run panel switches to bins.
MAX_BARS = 600
ZOOM_STEPS = 60
WAIT_COLOR = "#d62728"
COMPUTE_COLOR = "#1f77b4"
_VERDICT_COLOR = {"healthy": "#2ca02c", "mild": "#e6a700", "starved": "#d62728", "short": "#777777"}
_VERDICT_TEXT = {
    "healthy": "HEALTHY: the input pipeline keeps up",
    "mild": "MILDLY STARVED: training waits for data some of the time",
    "starved": "STARVED: training waits for data",
    "short": "TOO SHORT TO JUDGE",
}


def _rolling_sum(x: np.ndarray, window: int) -> np.ndarray:
    c = np.concatenate([[0.0], np.cumsum(x)])
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(idx - window, 0)
    return c[idx] - c[lo]


def _zoom_start(run: RunLog, summary: WatchSummary) -> int:
    n = run.steps
    if n <= ZOOM_STEPS:
        return 0
    if summary.sawtooth is not None:
        start = summary.sawtooth.first_spike + ZOOM_STEPS // 4
    elif summary.stalls:
        worst = max(summary.stalls, key=lambda s: s.wait_s)
        start = worst.step - ZOOM_STEPS // 2
    else:  # the middle of the run after warm-up: the steady state
        start = max(STALL_WARMUP_STEPS, n // 2 - ZOOM_STEPS // 2)
    return int(min(max(start, 0), n - ZOOM_STEPS))


def plot_timeline(run: RunLog, summary: WatchSummary, path: str | os.PathLike[str]) -> None:
    """Draw the timeline of ``run`` to an image file (format from the suffix, e.g. ``.png``).

    Args:
        run: the loaded log.
        summary: its summary (``summarize(run)``).
        path: the image to write.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        4, 1, figsize=(12, 9.5), gridspec_kw={"height_ratios": [3, 2.2, 1.5, 1.5]}
    )
    ax_all, ax_zoom, ax_frac, ax_rate = axes
    fig.suptitle(
        f"{_VERDICT_TEXT[summary.verdict]}  ({summary.evidence})",
        color=_VERDICT_COLOR[summary.verdict],
        fontsize=13,
        fontweight="bold",
        x=0.01,
        ha="left",
    )
    subtitle = summary.diagnosis + (f" -> {summary.action}" if summary.action else "")
    fig.text(0.01, 0.945, subtitle, fontsize=9.5, color="#333333", ha="left", wrap=True)
    stall_idx = np.array([s.step for s in find_stalls(run)], dtype=int)
    _full_run(ax_all, run, stall_idx)
    _zoom(ax_zoom, run, summary, stall_idx)
    window = max(8, min(run.every, run.steps // 20))
    _wait_share(ax_frac, run, window)
    _throughput(ax_rate, run, window)
    for ax in axes:
        ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(os.fspath(path), dpi=110)
    plt.close(fig)


def _full_run(ax: Any, run: RunLog, stall_idx: np.ndarray) -> None:
    """Panel 1: every step (binned past ``MAX_BARS``), epoch starts and stalls."""
    n = run.steps
    steps = np.arange(n)
    wait_ms, comp_ms = run.wait * 1e3, run.compute * 1e3
    top = np.percentile(wait_ms + comp_ms, 99.5) * 1.35 if n else 1.0
    if n <= MAX_BARS:
        ax.bar(steps, wait_ms, width=1.0, color=WAIT_COLOR, label="data wait", lw=0)
        ax.bar(
            steps, comp_ms, width=1.0, bottom=wait_ms, color=COMPUTE_COLOR, label="compute", lw=0
        )
    else:
        bins = int(np.ceil(n / MAX_BARS))
        m = n // bins * bins
        centre = steps[:m].reshape(-1, bins).mean(axis=1)
        w_mean = wait_ms[:m].reshape(-1, bins).mean(axis=1)
        c_mean = comp_ms[:m].reshape(-1, bins).mean(axis=1)
        w_max = wait_ms[:m].reshape(-1, bins).max(axis=1)
        ax.fill_between(centre, 0, w_mean, color=WAIT_COLOR, label="data wait (mean)", lw=0)
        ax.fill_between(
            centre, w_mean, w_mean + c_mean, color=COMPUTE_COLOR, label="compute (mean)", lw=0
        )
        ax.plot(centre, w_max, color=WAIT_COLOR, lw=0.6, alpha=0.7, label="worst wait in bin")
        top = max(top, float(np.percentile(w_max + c_mean, 99)) * 1.2)
    for e in run.epoch_starts:
        ax.axvline(e - 0.5, color="#555555", ls="--", lw=1)
    if len(stall_idx):
        tops = np.minimum(wait_ms[stall_idx] + comp_ms[stall_idx], top * 0.97)
        ax.scatter(
            stall_idx, tops, marker="v", s=60, color="black", zorder=5,
            label=f"stall ({len(stall_idx)})",
        )  # fmt: skip
    ax.set_ylim(0, top)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylabel("ms per step")
    ax.set_title("every step: data wait (red) + compute (blue)", loc="left", fontsize=10)
    ax.legend(loc="upper right", fontsize=8, ncol=4)


def _zoom(ax: Any, run: RunLog, summary: WatchSummary, stall_idx: np.ndarray) -> None:
    """Panel 2: ``ZOOM_STEPS`` consecutive steps around the sawtooth or the worst stall."""
    wait_ms, comp_ms = run.wait * 1e3, run.compute * 1e3
    z0 = _zoom_start(run, summary)
    z1 = min(run.steps, z0 + ZOOM_STEPS)
    zs = np.arange(z0, z1)
    ax.bar(zs, wait_ms[z0:z1], width=0.85, color=WAIT_COLOR, label="data wait")
    ax.bar(
        zs, comp_ms[z0:z1], width=0.85, bottom=wait_ms[z0:z1], color=COMPUTE_COLOR, label="compute"
    )
    ax.axhline(float(np.median(comp_ms)), color=COMPUTE_COLOR, ls=":", lw=1)
    in_zoom = stall_idx[(stall_idx >= z0) & (stall_idx < z1)]
    z_tot = wait_ms[z0:z1] + comp_ms[z0:z1]
    calm = np.delete(z_tot, in_zoom - z0) if len(in_zoom) < len(z_tot) else z_tot
    z_top = float(np.max(calm)) * 1.3 if len(calm) else 1.0
    for i in in_zoom:  # stalls stay visible but do not flatten the other bars
        ax.scatter([i], [min(z_tot[i - z0], z_top * 0.95)], marker="v", s=60, color="black")
        ax.annotate(
            f"stall {wait_ms[i]:.0f} ms", (i, z_top * 0.95), xytext=(6, -4),
            textcoords="offset points", fontsize=8,
        )  # fmt: skip
    ax.set_ylim(0, z_top)
    what = f"zoom on steps {z0}-{z1 - 1}"
    if summary.sawtooth is not None:
        what += f": wait spikes every {summary.sawtooth.period} steps (sawtooth)"
    ax.set_title(what, loc="left", fontsize=10)
    ax.set_ylabel("ms per step")
    ax.set_xlim(z0 - 0.6, z1 - 0.4)


def _wait_share(ax: Any, run: RunLog, window: int) -> None:
    """Panel 3: the data-wait share of step time, rolling, over the verdict's bands."""
    steps = np.arange(run.steps)
    w_roll = _rolling_sum(run.wait, window)
    s_roll = w_roll + _rolling_sum(run.compute, window)
    frac = np.divide(w_roll, s_roll, out=np.zeros_like(w_roll), where=s_roll > 0) * 100
    ax.axhspan(0, HEALTHY_MAX_WAIT * 100, color="#2ca02c", alpha=0.12, lw=0)
    ax.axhspan(HEALTHY_MAX_WAIT * 100, STARVED_MIN_WAIT * 100, color="#e6a700", alpha=0.12)
    ax.axhspan(STARVED_MIN_WAIT * 100, 100, color="#d62728", alpha=0.10, lw=0)
    ax.fill_between(steps, 0, frac, color=WAIT_COLOR, alpha=0.35, lw=0)
    ax.plot(steps, frac, color=WAIT_COLOR, lw=1.2)
    ax.set_ylim(0, 100)
    ax.set_xlim(-0.5, run.steps - 0.5)
    ax.set_ylabel("data wait %")
    ax.set_title(
        f"share of step time spent waiting for data (last {window} steps)", loc="left", fontsize=10
    )


def _throughput(ax: Any, run: RunLog, window: int) -> None:
    """Panel 4: samples/s (or steps/s without batch sizes), rolling."""
    n = run.steps
    steps = np.arange(n)
    s_roll = _rolling_sum(run.wait, window) + _rolling_sum(run.compute, window)
    sized = not bool(np.isnan(run.size).any())
    per = run.size if sized else np.ones(n)
    rate = np.divide(_rolling_sum(per, window), s_roll, out=np.zeros_like(s_roll), where=s_roll > 0)
    ax.plot(steps, rate, color=COMPUTE_COLOR, lw=1.2)
    ax.fill_between(steps, 0, rate, color=COMPUTE_COLOR, alpha=0.15, lw=0)
    ax.set_ylim(0, float(np.percentile(rate, 99.5)) * 1.25 if n else 1)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylabel("samples/s" if sized else "steps/s")
    ax.set_xlabel("step")
    ax.set_title(f"throughput (last {window} steps)", loc="left", fontsize=10)
