"""Loader-test fixtures.

multiprocessing starts one resource-tracker process (and keeps a pipe to it) the first time a
spawn or forkserver child, or a shared-memory segment, needs it; it then lives for the whole
session. Starting it before the first test keeps the root leak fixture from blaming whichever
test happened to trigger it.
"""

from __future__ import annotations

import multiprocessing.resource_tracker

import pytest


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker_running() -> None:
    multiprocessing.resource_tracker.ensure_running()
