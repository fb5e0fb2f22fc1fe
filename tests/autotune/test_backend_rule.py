"""The backend rules on synthetic measurements (no timing): the probe's facts to a backend,
and the process-to-thread handover judged on the training loop, not only the GIL."""

from __future__ import annotations

import pytest

from stoker.autotune._backend_rule import (
    COW_BYTES_PER_SAMPLE,
    GIL_FREE,
    INLINE_BATCH_S,
    LOOP_CPU_FREE,
    LOOP_TIME_SHARE,
    TAIL_MAX_THREADS,
    TAIL_PARALLEL_CORES,
    TAIL_WAIT_SHARE,
    THREAD_SPEEDUP,
    THREAD_WAIT_SHARE,
    ProbeFacts,
    decide_backend,
    early_samples,
    hand_over,
    settled,
    tail_threads,
    wants_speedup,
)
from stoker.autotune._gil import StepFigures

BATCH_S = 0.05  # a batch well above the inline threshold


def facts(**kw: object) -> ProbeFacts:
    base: dict[str, object] = {"waiting": 0.0, "waiting_all": 0.0, "batch_s": BATCH_S}
    return ProbeFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_samples_that_wait_and_run_in_parallel_in_threads_want_threads_to_cover_waits() -> None:
    choice = decide_backend(facts(waiting=0.9, waiting_all=0.9, speedup=THREAD_SPEEDUP + 0.2))
    assert (choice.backend, choice.waits) == ("thread", True)
    assert "mostly waits" in choice.why


def test_samples_that_wait_but_take_turns_in_threads_get_processes() -> None:
    choice = decide_backend(facts(waiting=0.9, waiting_all=0.9, speedup=1.1))
    assert choice.backend == "process" and "holds the GIL" in choice.why


def test_cpu_work_gets_processes_whatever_threads_would_do() -> None:
    assert not wants_speedup(0.1, copies=False)
    choice = decide_backend(facts(waiting=0.1, waiting_all=0.1))
    assert (choice.backend, choice.waits) == ("process", False)
    assert "CPU work" in choice.why


@pytest.mark.parametrize(
    ("cores", "backend"), [(TAIL_PARALLEL_CORES + 0.3, "thread"), (1.0, "process")]
)
def test_a_heavy_tail_gets_threads_only_when_they_kept_cores_busy(
    cores: float, backend: str
) -> None:
    tail = facts(waiting=0.05, waiting_all=TAIL_WAIT_SHARE + 0.2)
    count = tail_threads(tail)
    assert 2 <= count <= TAIL_MAX_THREADS
    choice = decide_backend(
        ProbeFacts(**{**tail.__dict__, "tail_threads": count, "tail_cores": cores})
    )
    assert choice.backend == backend
    assert choice.waits == (backend == "thread")


def test_no_tail_test_when_the_samples_already_chose_threads_or_barely_wait() -> None:
    assert tail_threads(facts(waiting=0.9, waiting_all=0.9, speedup=THREAD_SPEEDUP)) == 0
    assert tail_threads(facts(waiting=0.0, waiting_all=TAIL_WAIT_SHARE - 0.01)) == 0


def test_batches_cheaper_than_a_hand_off_load_inline_only_when_allowed() -> None:
    cheap = facts(batch_s=INLINE_BATCH_S / 2)
    assert decide_backend(cheap).backend == "inline"
    assert (
        decide_backend(ProbeFacts(**{**cheap.__dict__, "allow_inline": False})).backend == "process"
    )


@pytest.mark.parametrize(
    ("speedup", "allow_inline", "backend"),
    [(THREAD_SPEEDUP, True, "thread"), (1.0, True, "inline"), (1.0, False, "thread")],
)
def test_a_dataset_forked_workers_would_copy_is_shared(
    speedup: float, allow_inline: bool, backend: str
) -> None:
    assert wants_speedup(0.0, copies=True)
    cow = facts(
        copied=4 * COW_BYTES_PER_SAMPLE, copies=True, speedup=speedup, allow_inline=allow_inline
    )
    choice = decide_backend(cow)
    assert choice.backend == backend and "copy the dataset" in choice.why
    assert not choice.waits


def test_a_loop_that_leaves_the_gil_free_and_runs_little_gets_threads() -> None:
    threads, why = hand_over([GIL_FREE / 4] * 5, [LOOP_CPU_FREE / 4] * 5)
    assert threads and "handing over to threads" in why


def test_a_loop_that_holds_the_gil_keeps_processes() -> None:
    threads, why = hand_over([0.5] * 5, [0.9] * 5)
    assert not threads and "holds the GIL" in why


def test_a_launch_phase_of_small_ops_keeps_processes_though_the_gil_reads_free() -> None:
    # Each small op gives the GIL up, so a sentinel reads it free; the loop's own CPU share
    # shows the launch phase thread workers would slow.
    threads, why = hand_over([GIL_FREE / 4] * 5, [0.1] * 5)
    assert not threads and "launches ops" in why


def test_a_starved_launch_phase_is_read_over_the_loops_own_time() -> None:
    # heavytail's GPU-like step while workers start: 2 ms of launches, 20 ms of device wait
    # and 100 ms waiting in next(): 1.6% of the wall time, 9% of the loop's own.
    gil, wall = [GIL_FREE / 4] * 5, [LOOP_CPU_FREE / 2] * 5
    threads, why = hand_over(gil, wall, StepFigures(0.09, 0.0, 0.18))
    assert not threads and "9% of its own time" in why
    # Without the loop's own time measured, the wall-time share decides.
    assert hand_over(gil, wall, None)[0]
    # A loop whose own time is mostly a device wait (its launches under the threshold).
    threads, why = hand_over(gil, [0.5] * 5, StepFigures(LOOP_CPU_FREE / 2, 0.0, 0.9))
    assert threads and "of its own time" in why


def test_a_loop_that_only_counts_its_batches_gets_threads() -> None:
    # Its own time is all Python, but a sliver of the wall time: nothing for threads to slow.
    gil, wall = [GIL_FREE / 4] * 5, [LOOP_CPU_FREE / 2] * 5
    threads, why = hand_over(gil, wall, StepFigures(1.0, 0.0, LOOP_TIME_SHARE / 2))
    assert threads and "of the wall time" in why
    assert not hand_over(gil, wall, StepFigures(1.0, 0.0, LOOP_TIME_SHARE))[0]


@pytest.mark.parametrize(
    ("busy", "cores"),
    [
        # The bench's CPU step beside io: its thread busy most of the step, torch's other
        # threads on another core, the GIL free between long ops; processes below its
        # priority leave it its cores.
        (0.7, 0.9),
        # A GPU loop whose thread spins in a device sync: busy, but no other thread computes.
        (0.95, 0.0),
        # A launch phase then a device wait: the thread idle most of the step.
        (0.1, 0.9),
    ],
)
def test_a_loop_busy_in_its_own_time_keeps_processes(busy: float, cores: float) -> None:
    step = StepFigures(busy, cores, 0.9)
    threads, why = hand_over([GIL_FREE / 4] * 5, [0.2] * 5, step)
    assert not threads and "launches ops" in why and f"{cores:.1f} more cores" in why


def test_a_busy_loop_without_step_readings_keeps_processes() -> None:
    assert not hand_over([GIL_FREE / 4] * 5, [0.5] * 5, None)[0]


def test_without_the_loops_cpu_clock_the_gil_readings_decide_alone() -> None:
    assert hand_over([GIL_FREE / 4] * 5, [])[0]
    assert not hand_over([], [])[0]


def test_the_median_reading_decides() -> None:
    # One disturbed reading (a worker starting holds the GIL) does not decide.
    assert hand_over([0.01, 0.01, 0.9, 0.01, 0.01], [0.0, 0.0, 0.5, 0.0, 0.0])[0]
    assert not hand_over([0.01] * 5, [0.0, LOOP_CPU_FREE * 3, LOOP_CPU_FREE * 3, 0.5, 0.0])[0]


def test_wait_shares_at_the_thresholds() -> None:
    assert decide_backend(
        facts(waiting=THREAD_WAIT_SHARE, waiting_all=THREAD_WAIT_SHARE, speedup=THREAD_SPEEDUP)
    ).waits


def test_a_serial_pass_of_plain_cpu_work_may_stop_early() -> None:
    assert settled(0.0, 0.0, 0.0)
    assert not settled(THREAD_WAIT_SHARE, 0.0, 0.0)  # samples that wait need the thread test
    assert not settled(0.0, TAIL_WAIT_SHARE, 0.0)  # a tail needs the tail test
    assert not settled(0.0, 0.0, COW_BYTES_PER_SAMPLE)  # copying needs the full pass
    assert early_samples(1) >= 2 and early_samples(512) == 1024  # two batches at least
