"""The rules that pick inline, thread or process loading from what was measured (pure logic).

:func:`decide_backend` takes the backend probe's facts (see :mod:`stoker.autotune._probe`):

* **threads** when the typical sample mostly *waits* (storage, network: the median sample
  uses little CPU for its wall time) and two threads load nearly twice as fast as one: many
  threads hide the waits without pickling, inter-process copies or per-worker copies of the
  dataset. The median, not the mean, so that a rare slow sample (a heavy tail) does not pass
  for I/O;
* **threads** too when a few slow samples wait for a large share of the loading time (a heavy
  tail) and the work between the waits runs in parallel in threads: covering those waits takes
  more workers than cores, and threads cost no process each. Two threads loading faster than
  one does not show that: overlapping the waits alone speeds them up, GIL or not. So enough
  threads load at once to keep three cores busy were the work free of the GIL, and the cores
  they kept busy tell: more than one, and they ran in parallel (on a machine whose other
  processes leave this one a core or less, threads are not chosen);
* **inline** (``num_workers="auto"`` only) when a whole batch loads faster than the main
  process would take to receive it from a worker, or when forked workers would copy the
  dataset as they read it and threads would not run the work in parallel either: loading in
  the main process then costs less and copies nothing;
* **threads** when forked workers would copy the dataset and the work runs in parallel in
  threads (it releases the GIL);
* **processes** otherwise: CPU work, even GIL-free work such as decoding, runs in parallel in
  processes just as well and never contends with the training loop for the GIL.

Threads chosen to cover waits are a wish, not a verdict, with ``num_workers="auto"``: processes
start, and :func:`hand_over` decides from the training loop itself whether threads would do
better (see :mod:`stoker.loader._switch`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

from stoker.autotune._gil import StepFigures

__all__ = [
    "COW_BYTES_PER_SAMPLE",
    "GIL_FREE",
    "INLINE_BATCH_S",
    "LOOP_CPU_FREE",
    "LOOP_TIME_SHARE",
    "Choice",
    "ProbeFacts",
    "decide_backend",
    "early_samples",
    "hand_over",
    "settled",
    "tail_threads",
    "wants_speedup",
]

# Two threads must beat one by this factor for threads to be chosen.
THREAD_SPEEDUP = 1.6
# ... and the median sample must spend at least this share of its wall time waiting,
THREAD_WAIT_SHARE = 0.5
# ... or the serial pass at least this share of its whole wall time (slow samples that wait),
TAIL_WAIT_SHARE = 0.25
# ... and threads enough to keep three cores busy, were the work free of the GIL, must have
# kept at least this many busy on average (GIL-bound threads keep at most one busy).
TAIL_PARALLEL_CORES = 1.3
# Most threads that pass may use, and how long it measures.
TAIL_MAX_THREADS = 8
TAIL_WINDOW_S = 0.15
# A serial pass of this many samples (two batches at least) that shows CPU work without a
# wait, a tail or copying stops there: the rules answer processes or inline whatever more such
# samples show, and cheap samples need not fill the pass's time (a tail rarer than one sample
# in this many may go unseen, as it may in a pass of expensive samples).
EARLY_SAMPLES = 128
# A batch that loads in less than this in the probe's forked child (warmed up by a batch, it
# reads about the main process's time: tiny 0.43-0.70 ms; see _probe_passes.WARM_UP_S) is
# cheaper to load in the main process than to receive from a worker: receiving costs the main
# process 0.3-0.7 ms of CPU in a tight loop, and 1-1.8 ms after a GPU-like step's wait (its
# caches gone cold), where a group of batches loaded inline runs warm. tiny, 2-core VM: inline
# against 2-3 process workers, GPU-like step 42.4 against 39.9 steps/s (torch without workers
# 41-42), CPU step 146 against 115 (benchmarks/README.md). Set where the child used to read
# 1.5 ms with two samples of warm-up (1.3-1.6x the main process's time then). On 2026-11-28
# the child read tiny at 0.61-1.17 ms, in two modes about 1.5x apart, and chose processes in
# 2 of 12 loaders at 1.2 ms, which lost tiny's CPU step to torch without workers (86.6
# against 98.0 steps/s); tiny's batch at 384 samples read 0.81-1.65 ms (inline ties processes
# on the GPU-like step and leads the CPU step 96.4 to 79.9), at 512 samples 1.14-2.06 ms
# (both steps tie, processes load 1.3x as fast): hence 1.3 ms (benchmarks/README.md).
INLINE_BATCH_S = 1.3e-3
# Private bytes per sample read above which forked workers are said to copy the dataset
# (a Python object read in a random order dirties about one 4 KiB page).
COW_BYTES_PER_SAMPLE = 1024
# The median GIL wait (a share of the switch interval) under which the training loop is
# taken to leave the GIL free.
GIL_FREE = 0.1
# ... and the share of the loop's own time (outside stoker's next()) its thread spends on a CPU
# (its Python and the launches of its torch ops) under which it runs too little for threads to
# slow it: each small op gives up the GIL and waits for it back, so a sentinel thread sees the
# GIL free while a thread worker takes it at every op of the launch phase.
LOOP_CPU_FREE = 0.03
# ... or the share of the wall time the loop's own time takes, under which whatever it does
# there is too little to slow (a loop that only counts its batches). Read over the wall time
# alone, heavytail's GPU-like step starved at start-up (2 ms of launches, a 20 ms device wait,
# 100 ms waiting for data) read 1.6% busy and handed over to threads that ran 1.5 steps/s.
LOOP_TIME_SHARE = 0.05


@dataclass(frozen=True)
class ProbeFacts:
    """What the backend probe measured.

    Attributes:
        waiting: the median sample's share of its wall time spent off the CPU.
        waiting_all: the serial pass's share of its wall time spent off the CPU.
        batch_s: seconds a batch took to load and collate in the serial pass.
        copied: private bytes per sample reading copied (forked workers' copy-on-read).
        copies: forked workers would copy the dataset (``copied`` is large and the dataset
            holds large containers of Python objects).
        allow_inline: loading in the main process is an option (``num_workers="auto"``).
        speedup: how much faster two threads loaded than one (None: not measured).
        tail_threads: threads that loaded at once for the tail's test (0: not run).
        tail_cores: cores they kept busy on average (None: not measured).
    """

    waiting: float
    waiting_all: float
    batch_s: float
    copied: float = 0.0
    copies: bool = False
    allow_inline: bool = True
    speedup: float | None = None
    tail_threads: int = 0
    tail_cores: float | None = None

    @property
    def mostly_waits(self) -> bool:
        """The median sample spends most of its wall time waiting (not only a heavy tail)."""
        return self.waiting >= THREAD_WAIT_SHARE

    @property
    def parallel(self) -> bool:
        """Two threads loaded nearly twice as fast as one."""
        return self.speedup is not None and self.speedup >= THREAD_SPEEDUP


@dataclass(frozen=True)
class Choice:
    """A backend, why, and whether threads were chosen to cover waits (processes do as well
    there, and better while the training loop holds the GIL)."""

    backend: Literal["inline", "thread", "process"]
    why: str
    waits: bool = False


def wants_speedup(waiting: float, copies: bool) -> bool:
    """Whether two threads against one matters: to samples that wait and to datasets that
    forked workers would copy (CPU work goes to processes whatever threads do)."""
    return waiting >= THREAD_WAIT_SHARE or copies


def early_samples(batch_size: int) -> int:
    """Samples a serial pass loads at least before :func:`settled` may stop it."""
    return max(EARLY_SAMPLES, 2 * batch_size)


def settled(waiting: float, waiting_all: float, copied: float) -> bool:
    """Whether a serial pass that shows these figures so far may stop: the median sample
    computes, no wait adds up to a tail, and reading copies nothing (no thread test is run,
    and the answer is processes or inline by the batch time alone). With a margin of half
    each threshold: figures near one are left to the full pass."""
    return (
        waiting < THREAD_WAIT_SHARE / 2
        and waiting_all < TAIL_WAIT_SHARE / 2
        and copied < COW_BYTES_PER_SAMPLE / 2
    )


def tail_threads(facts: ProbeFacts) -> int:
    """Threads to test a heavy tail with (0: no test needed).

    Overlapped waits alone make two threads up to ``1 / (1 - waiting_all)`` times as fast as
    one, GIL or not: whether the work between them runs in parallel shows in the cores that
    threads enough to fill three of them, were it GIL-free, keep busy.
    """
    if (facts.mostly_waits and facts.parallel) or (facts.waiting_all < TAIL_WAIT_SHARE):
        return 0
    return min(TAIL_MAX_THREADS, max(2, math.ceil(3 / max(1.0 - facts.waiting_all, 1e-3))))


def decide_backend(facts: ProbeFacts) -> Choice:
    """The backend for ``facts`` (see the module docstring)."""
    waiting, speedup = facts.waiting, facts.speedup or 0.0
    if facts.mostly_waits and facts.parallel:
        return Choice(
            "thread",
            f"loading mostly waits (the median sample waits {waiting:.0%} of its time) and two "
            f"threads loaded {speedup:.1f}x as fast as one: threads hide the waits without "
            "pickling or copying",
            waits=True,
        )
    cores = facts.tail_cores
    if facts.waiting_all >= TAIL_WAIT_SHARE and cores is not None and cores >= TAIL_PARALLEL_CORES:
        return Choice(
            "thread",
            f"a few slow samples wait ({facts.waiting_all:.0%} of the loading time waits, the "
            f"median sample {waiting:.0%}) and {facts.tail_threads} threads kept {cores:.1f} "
            "cores busy: covering the waits takes more workers than cores, and threads cost no "
            "process each",
            waits=True,
        )
    batch_ms = facts.batch_s * 1e3
    cow_why = (
        f"forked workers would copy the dataset as they read it ({facts.copied / 1024:,.1f} "
        "KiB per sample measured; `stoker.compact` or numpy arrays let processes share it)"
    )
    if facts.allow_inline and facts.batch_s < INLINE_BATCH_S:
        return Choice(
            "inline",
            f"a batch loads in {batch_ms:.2f} ms: less than receiving it from a worker would "
            "cost the main process, so it loads there" + (f"; {cow_why}" if facts.copies else ""),
        )
    if facts.copies:
        if facts.parallel:
            return Choice(
                "thread", f"{cow_why}; two threads loaded {speedup:.1f}x as fast as one: threads"
            )
        if facts.allow_inline:
            return Choice(
                "inline",
                f"{cow_why}; two threads loaded only {speedup:.1f}x as fast as one (the work "
                f"holds the GIL); a batch loads in {batch_ms:.2f} ms: loading in the main "
                "process",
            )
        return Choice("thread", f"{cow_why}: threads share it")
    if waiting < THREAD_WAIT_SHARE:
        return Choice(
            "process",
            f"loading is CPU work (the median sample computes {1 - waiting:.0%} of its time): "
            "processes run it in parallel without contending with the training loop for the GIL",
        )
    return Choice(
        "process",
        f"two threads loaded only {speedup:.1f}x as fast as one: loading holds the GIL, so it "
        "needs processes",
    )


def hand_over(
    gil_waits: list[float],
    loop_cpu: list[float],
    step: StepFigures | None = None,
) -> tuple[bool, str]:
    """Whether process workers started for loading that waits should hand over to threads,
    and why, from readings taken while the training loop ran.

    Args:
        gil_waits: how long a waking thread waited for the GIL, per reading, as a share of the
            switch interval (:class:`~stoker.autotune._gil.GilMeter`).
        loop_cpu: the training loop's thread's share of wall time on a CPU outside stoker's
            ``next()``, per reading (empty where it could not be read: the GIL readings
            decide alone); used where ``step`` is None.
        step: over the readings, the same thread's share of the loop's own time (outside
            ``next()``) on a CPU, the cores the process's other threads (torch's intra-op
            threads) kept busy in it, and that time's share of the wall time (None: not
            measured).

    Threads when the loop leaves the GIL free *and* runs almost no Python or op launches of
    its own: a loop that launches many small ops (the launch phase of a GPU step) gives the
    GIL up at every op, which a sentinel reads as free, yet a thread worker takes it each time
    and the launch phase waits for it back. A step that computes on the CPU keeps processes
    too: below its priority (``worker_nice``) they leave it its cores, where threads share
    them (io's CPU step, 2-core VM: processes 47.0 steps/s, threads 43.8, benchmarks/README.md).
    """
    if not gil_waits:
        return False, "no reading of the GIL was taken: processes stay"
    gil = statistics.median(gil_waits)
    if gil >= GIL_FREE:
        return False, (
            f"the training loop holds the GIL (a waking thread waited {gil:.0%} of the switch "
            "interval for it): thread workers would wait for it after every wait, so "
            "processes stay"
        )
    # Of the loop's own time where measured: over the wall time, a loop starved of data
    # reads idle.
    cpu = step.busy if step is not None else statistics.median(loop_cpu) if loop_cpu else None
    when = "its own time" if step is not None else "the time"
    counts = step is None or step.share >= LOOP_TIME_SHARE
    if cpu is not None and cpu >= LOOP_CPU_FREE and counts:
        others = f", torch's other threads {step.cores:.1f} more cores" if step else ""
        return False, (
            f"the training loop runs Python or launches ops {cpu:.0%} of {when}{others} (a "
            f"waking thread waited only {gil:.0%} of the switch interval for the GIL, which "
            "each op gives up): thread workers would take the GIL from every launch and share "
            "the cores processes leave it, so processes stay"
        )
    busy = f", its thread on a CPU {cpu:.0%} of {when}" if cpu is not None else ""
    if step is not None and step.share < LOOP_TIME_SHARE:
        busy = f", its own time {step.share:.0%} of the wall time"
    return True, (
        f"the training loop leaves the GIL free (a waking thread waited {gil:.0%} of the "
        f"switch interval for it{busy}): handing over to threads"
    )
