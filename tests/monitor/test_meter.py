"""The watch's loop only records steps; folding them later in chunks gives exactly what adding
them one at a time gives (totals, windows, interval, quantiles and stalls)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.monitor._meter import StepMeter

steps = st.lists(
    st.tuples(
        st.one_of(st.floats(0.0, 0.01), st.floats(0.05, 2.0)),  # waits: some far above
        st.floats(0.0, 0.05),
        st.one_of(st.none(), st.integers(0, 512)),
    ),
    min_size=1,
    max_size=400,
)


def _state(m: StepMeter) -> tuple:
    iv = m.interval
    return (
        m.steps, m.samples, m.sized, round(m.wait_s, 9), round(m.compute_s, 9), m.max_wait_s,
        list(m.recent_wait), list(m.recent_compute), list(m.recent_size),
        [m.wait_hist.quantile(q) for q in (0.1, 0.5, 0.95)],
        [m.compute_hist.quantile(q) for q in (0.1, 0.5, 0.95)],
        iv.steps, iv.samples, iv.sized, round(iv.wait_s, 9), round(iv.compute_s, 9),
        m.stall_events,
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(steps=steps, cuts=st.lists(st.integers(1, 400), max_size=8), later_pass=st.booleans())
def test_folding_in_chunks_equals_adding_each_step(steps, cuts, later_pass) -> None:
    one, chunked = StepMeter(), StepMeter()
    if later_pass:
        one.start_epoch()
        chunked.start_epoch()
    folded_events = []
    bounds = sorted({0, len(steps), *(c for c in cuts if c < len(steps))})
    for lo, hi in itertools.pairwise(bounds):
        for k, (wait, compute, size) in enumerate(steps[lo:hi], start=lo):
            one.add(wait, compute, size)
            chunked.pending.start.append(float(k))
            chunked.pending.wait.append(wait)
            chunked.pending.compute.append(compute)
            chunked.pending.size.append(size)
        folded_events += chunked.fold()
        assert len(chunked.pending) == 0
    assert _state(chunked) == _state(one)
    assert folded_events == one.stall_events
    assert all(e.epoch_start == (later_pass and e.step == 0) for e in folded_events)
