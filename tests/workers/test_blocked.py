"""The workers' blocked sampler: time asleep inside loading, not time queued for a core."""

from __future__ import annotations

import os
import select
import struct
import time

import pytest

from stoker._introspect.platform import thread_sched_seconds, usable_cores
from stoker.workers import _blocked
from stoker.workers._blocked import BlockedSampler

pytestmark = pytest.mark.skipif(
    thread_sched_seconds() is None, reason="needs /proc/thread-self/schedstat (Linux)"
)

# Sub-tick batches: the kernel credits time queued for a core late, so a single fetch this
# short that was preempted reads as blocked unless spans cover many of them.
BATCH_S = 0.0005
CHILD_LIMIT_S = 20.0


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _span(sampler: BlockedSampler, work) -> tuple[float, float]:
    sampler._next = 0.0
    while True:
        sampler.begin()
        work()
        result = sampler.end()
        if result is not None:
            return result


@pytest.mark.measures  # asserts shares of measured running and sleeping time
def test_cpu_work_reads_as_running_sleep_as_blocked_and_task_waits_as_neither(monkeypatch):
    monkeypatch.setattr(_blocked, "BLOCKED_SPAN_S", 0.02)
    sampler = BlockedSampler()
    running, blocked = _span(sampler, lambda: _spin(BATCH_S))
    assert running >= 0.015 and blocked < 0.3 * running

    running, blocked = _span(sampler, lambda: time.sleep(0.025))
    assert blocked >= 0.02 and running < 0.005

    def wait_for_a_task() -> None:
        t0 = time.perf_counter()
        time.sleep(0.025)  # between batches: the worker waits on its task queue
        sampler.waited(time.perf_counter() - t0)

    running, blocked = _span(sampler, wait_for_a_task)
    assert blocked < 0.005


def test_no_span_is_sampled_until_one_is_due(monkeypatch):
    monkeypatch.setattr(_blocked, "BLOCKED_SPAN_S", 0.0)
    monkeypatch.setattr(_blocked, "BLOCKED_SAMPLE_S", 60.0)
    sampler = BlockedSampler()
    sampler.begin()
    assert sampler.end() is not None
    sampler.begin()
    assert sampler.end() is None  # the next span is a minute away
    sampler.waited(1.0)  # no span open: nothing to leave out
    assert sampler._idle == 0.0


def test_the_samplers_of_one_gate_take_turns(monkeypatch):
    """A thread pool's samplers share a gate: one opening a span holds the others off for a
    span and a gap (each read of the scheduler statistics costs the pool a GIL hand-off)."""
    monkeypatch.setattr(_blocked, "BLOCKED_SPAN_S", 0.0)
    monkeypatch.setattr(_blocked, "BLOCKED_SAMPLE_S", 60.0)
    gate = [0.0]
    first, second, alone = BlockedSampler(gate), BlockedSampler(gate), BlockedSampler()
    first.begin()
    second.begin()
    alone.begin()
    assert first.end() is not None
    assert second.end() is None  # the gate held it off
    assert alone.end() is not None  # a sampler without the gate is on its own
    assert gate[0] > time.perf_counter() + 59


@pytest.mark.measures  # asserts a share measured beside other busy processes
def test_workers_that_only_take_turns_on_the_cores_are_not_blocked():
    # One more busy process than cores, each loading sub-tick batches: a third of their
    # time is spent queued for a core. Sampled batch by batch, that read as 30% blocked
    # (and the controller added workers to cover it); over spans it reads near zero.
    procs = max(2, usable_cores()) + 1
    read_fd, write_fd = os.pipe()
    pids = []
    try:
        for _ in range(procs):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                share = 1.0
                try:
                    os.close(read_fd)
                    sampler = BlockedSampler()
                    running = blocked = 0.0
                    end = time.perf_counter() + 1.0
                    while time.perf_counter() < end:
                        r, b = _span(sampler, lambda: _spin(BATCH_S))
                        running, blocked = running + r, blocked + b
                    share = blocked / (running + blocked)
                finally:
                    os.write(write_fd, struct.pack("d", share))
                    os._exit(0)
            pids.append(pid)
        os.close(write_fd)
        write_fd = -1
        shares: list[float] = []
        deadline = time.monotonic() + CHILD_LIMIT_S
        while len(shares) < procs and time.monotonic() < deadline:
            if select.select([read_fd], [], [], 0.5)[0]:
                data = os.read(read_fd, 8)
                if not data:
                    break
                shares.append(struct.unpack("d", data)[0])
        assert len(shares) == procs, shares
        assert max(shares) < 0.15, shares
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
