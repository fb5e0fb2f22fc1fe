"""A log is untrusted input: whatever bytes or values it holds, `stoker report` reads it and
prints its summary, or says what is wrong with it as a ConfigError; never another exception."""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any

import pytest
from _monitor_synthetic import FakeClock, consume, producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from stoker.errors import ConfigError
from stoker.monitor import Watch
from stoker.monitor._report import load_run, summarize
from stoker.monitor._report_cli import _table

EXAMPLES = 150

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@pytest.fixture(scope="module")
def valid_lines() -> list[str]:
    waits = [0.5 if i == 60 else (0.030 if i % 4 == 3 else 0.0005) for i in range(120)]
    clock = FakeClock()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.jsonl")
        consume(
            Watch(producer(clock, waits), clock=clock, progress=False, every=20, log=path),
            clock,
            0.01,
        )
        with open(path) as f:
            return f.read().splitlines()


def _report(data: bytes) -> None:
    """Read the log and render what `stoker report` prints; ConfigError is the only way out."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fuzzed.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        try:
            run = load_run(path)
            summary = summarize(run)
            Console(file=io.StringIO(), width=150).print(_table(summary, path))
        except ConfigError:
            pass


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.binary(max_size=2000))
def test_random_bytes_are_read_or_refused(data: bytes) -> None:
    _report(data)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(choice=st.data())
def test_mutated_records_are_read_or_refused(valid_lines: list[str], choice: Any) -> None:
    lines = list(valid_lines)
    for _ in range(choice.draw(st.integers(1, 4))):
        i = choice.draw(st.integers(0, len(lines) - 1))
        record = json.loads(lines[i])
        if isinstance(record, dict) and record and choice.draw(st.booleans()):
            key = choice.draw(st.sampled_from(sorted(record)))
            record[key] = choice.draw(json_values)
        else:
            record = choice.draw(json_values)
        lines[i] = json.dumps(record)
    _report("\n".join(lines).encode() + b"\n")


def test_the_unmutated_log_is_read(valid_lines: list[str]) -> None:
    """The fuzz starts from a log that loads: refusals are the mutations' doing."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.jsonl")
        with open(path, "w") as f:
            f.write("\n".join(valid_lines) + "\n")
        assert summarize(load_run(path)).steps > 0
