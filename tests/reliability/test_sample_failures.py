"""Samples that fail to load: ``on_error``, ``max_failures`` and where the error is raised.

Promises (issue 4): an exception in ``__getitem__``, ``collate_fn``, ``worker_init_fn`` or
``__iter__`` is re-raised in the main process with its original type and notes naming the
worker, its pid and the sample indices (``on_error="raise"``); ``"skip"`` drops the sample,
``"replace"`` substitutes another so that every batch keeps its size; every failure is recorded
(index, type, message, worker) in ``loader.failures`` and counted in ``loader.stats()``;
exceeding ``max_failures`` (a count, or a fraction of samples seen after
``stoker.faults.PROBATION_SAMPLES``) raises one ``FailureLimitError`` that lists them. Corrupt
JPEG files (truncated, bit-flipped) decoded with Pillow give an exact survivor count and an
exact skip list.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from _faulty import (
    FailingCollate,
    FailingDataset,
    FailingIterable,
    FailingWorkerInit,
    FlakyStream,
    JpegFolder,
    corrupt_bitflip,
    corrupt_truncate,
    write_jpegs,
)
from _isolate import run_case

import stoker
from stoker.faults import PROBATION_SAMPLES

pytestmark = pytest.mark.timeout(120)

N = 40
BATCH = 4
WORKERS = [0, 2]


def _digest(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return hashlib.sha1(value.contiguous().numpy().tobytes()).hexdigest()[:16]
    return repr(value)


def case_iterate(dataset: Any, workers: int, epochs: int = 1, **kwargs: Any) -> dict[str, Any]:
    """Iterate ``epochs`` epochs; report batches as ``[(index, digest of the rest)]``."""
    kwargs.setdefault("batch_size", BATCH)
    if workers:
        kwargs.setdefault("multiprocessing_context", "fork")
    loader = stoker.DataLoader(dataset, num_workers=workers, **kwargs)
    batches: list[list[tuple[int, str]]] = []
    error: dict[str, Any] = {}
    try:
        for _ in range(epochs):
            for batch in loader:
                index = batch[0] if isinstance(batch, (list, tuple)) else batch
                rest = batch[1] if isinstance(batch, (list, tuple)) else None
                rows = []
                for k, i in enumerate(torch.as_tensor(index).reshape(-1).tolist()):
                    rows.append((int(i), _digest(rest[k]) if rest is not None else ""))
                batches.append(rows)
    except BaseException as exc:
        error = {
            "type": type(exc).__name__,
            "mro": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
            "notes": list(getattr(exc, "__notes__", [])),
            "listed": [dataclasses.astuple(f) for f in getattr(exc, "failures", [])],
        }
    failures = [dataclasses.astuple(f) for f in loader.failures]
    pids = [_pid(p) for p in getattr(loader._iterator, "_workers", [])]
    stats_failures: int | None = None
    stats_samples: int | None = None
    stats_error = ""
    try:
        stats = loader.stats()
        stats_failures = stats.failures
        stats_samples = stats.samples
        pids = [w.pid for w in stats.workers] or pids
    except Exception as exc:
        stats_error = f"{type(exc).__name__}: {exc}"
    del loader
    return {
        "batches": batches,
        "error": error,
        "failures": failures,
        "stats_failures": stats_failures,
        "stats_samples": stats_samples,
        "stats_error": stats_error,
        "pids": pids,
    }


def _pid(proc: Any) -> int | None:
    try:
        return int(proc.pid)
    except (ValueError, AttributeError, TypeError):  # a closed process object
        return None


def _indices(r: dict[str, Any]) -> list[int]:
    return [i for batch in r["batches"] for i, _ in batch]


def _fail_fields(r: dict[str, Any]) -> list[tuple[Any, ...]]:
    """(index, exc_type, message, replacement) of every recorded failure, by index."""
    rows = [(f[0], f[3], f[4], f[5]) for f in r["failures"]]
    return sorted(
        rows,
        key=lambda t: (not isinstance(t[0], int), t[0] if isinstance(t[0], int) else 0, repr(t[0])),
    )


# -- __getitem__ -----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", WORKERS)
def test_getitem_error_is_raised_with_type_worker_pid_and_indices(workers: int) -> None:
    r = run_case(case_iterate, dataset=FailingDataset(N, [13]), workers=workers).result
    err = r["error"]
    assert err["type"] == "SampleError" and "ValueError" in err["mro"], err
    assert err["message"] == "sample 13 is bad"
    assert _indices(r) == list(range(12)), "batches after the failing one were delivered"
    if workers:
        note = " ".join(err["notes"])
        assert "[12, 13, 14, 15]" in note and "worker" in note.lower(), err["notes"]
        assert any(f"pid {pid}" in note for pid in r["pids"]), (note, r["pids"])
    assert r["failures"] == []  # "raise" records nothing: it raises


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("in_order", [True, False])
def test_skip_drops_exactly_the_bad_samples(workers: int, in_order: bool) -> None:
    bad = [0, 5, 6, 7, 13, 39]  # includes a whole batch (4..7 minus 4) and the first sample
    r = run_case(
        case_iterate,
        dataset=FailingDataset(N, bad),
        workers=workers,
        on_error="skip",
        in_order=in_order,
    ).result
    assert r["error"] == {}
    survivors = [i for i in range(N) if i not in bad]
    if in_order:
        assert _indices(r) == survivors
    assert Counter(_indices(r)) == Counter(survivors)
    assert _fail_fields(r) == [(i, "SampleError", f"sample {i} is bad", None) for i in bad]
    for f in r["failures"]:
        assert f[1] == 0  # epoch
        assert 0 <= f[2] < max(1, workers)  # worker id
    # Batches shrink, none is empty, none grows.
    assert all(0 < len(b) <= BATCH for b in r["batches"])


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("on_error", ["skip", "replace"])
def test_stats_count_the_failures_after_the_epoch(workers: int, on_error: str) -> None:
    """Every failure is in ``loader.stats()`` too, also once the epoch is over, and its
    sample count is of the samples delivered (skipped ones are not)."""
    bad = [3, 9, 10]
    r = run_case(
        case_iterate, dataset=FailingDataset(N, bad), workers=workers, on_error=on_error
    ).result
    assert len(r["failures"]) == len(bad)
    assert r["stats_error"] == ""
    assert r["stats_failures"] == len(bad)
    assert r["stats_samples"] == len(_indices(r)) == (N - len(bad) if on_error == "skip" else N)


@pytest.mark.parametrize("workers", WORKERS)
def test_replace_keeps_every_batch_full_with_good_samples(workers: int) -> None:
    bad = [1, 5, 6, 7, 22]
    r = run_case(
        case_iterate, dataset=FailingDataset(N, bad), workers=workers, on_error="replace"
    ).result
    assert r["error"] == {}
    assert [len(b) for b in r["batches"]] == [BATCH] * (N // BATCH)
    recorded = _fail_fields(r)
    assert [f[0] for f in recorded] == bad
    replacements = [f[3] for f in recorded]
    assert all(j is not None and j not in bad for j in replacements), recorded
    expected = Counter(i for i in range(N) if i not in bad) + Counter(replacements)
    assert Counter(_indices(r)) == expected


def test_replacements_do_not_depend_on_the_worker_count() -> None:
    runs = [
        run_case(
            case_iterate, dataset=FailingDataset(N, [3, 17]), workers=w, on_error="replace"
        ).result
        for w in (0, 2)
    ]
    assert runs[0]["batches"] == runs[1]["batches"]


# -- max_failures ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_failures_are_in_sample_order_whichever_worker_fails_first(backend: str) -> None:
    # Batch 0 fails whole (nothing to deliver) and slowly; batch 2 (sample 9) fails at once on
    # the other worker. The record and the limit must not depend on which came first. The last
    # batch fails whole too: its failures must count although no delivery comes after it.
    bad, slow = [0, 1, 2, 3, 9, 30, 36, 37, 38, 39], [0, 1, 2, 3]
    kwargs: dict[str, Any] = {"backend": backend, "on_error": "skip"}
    whole = run_case(
        case_iterate, dataset=FailingDataset(N, bad, slow, 0.1), workers=2, **kwargs
    ).result
    assert whole["error"] == {} and [f[0] for f in whole["failures"]] == bad
    assert _indices(whole) == [i for i in range(N) if i not in bad]
    over = run_case(
        case_iterate,
        dataset=FailingDataset(N, bad, slow, 0.1),
        workers=2,
        max_failures=4,
        **kwargs,
    ).result
    assert over["error"]["type"] == "FailureLimitError", over["error"]
    assert [f[0] for f in over["error"]["listed"]] == [0, 1, 2, 3, 9]
    assert _indices(over) == [4, 5, 6, 7], "a batch before the fifth failure was lost"


@pytest.mark.parametrize("workers", WORKERS)
def test_failure_count_over_the_limit_raises_one_error_listing_them(workers: int) -> None:
    bad = [2, 9, 30]
    within = run_case(
        case_iterate,
        dataset=FailingDataset(N, bad),
        workers=workers,
        on_error="skip",
        max_failures=3,
    ).result
    assert within["error"] == {} and len(within["failures"]) == 3
    over = run_case(
        case_iterate,
        dataset=FailingDataset(N, bad),
        workers=workers,
        on_error="skip",
        max_failures=2,
    ).result
    err = over["error"]
    assert err["type"] == "FailureLimitError", err
    assert {"StokerError", "RuntimeError"} <= set(err["mro"])
    assert [f[0] for f in err["listed"]] == bad
    for i in bad:
        assert f"sample {i} " in err["message"] and f"sample {i} is bad" in err["message"]
    assert "max_failures=2" in err["message"]
    # The error came at the third failure: nothing after sample 30's batch was delivered.
    assert max(_indices(over)) < 32


@pytest.mark.parametrize("workers", WORKERS)
def test_fraction_tolerates_early_failures_during_probation(workers: int) -> None:
    n = 3 * PROBATION_SAMPLES
    r = run_case(
        case_iterate,
        dataset=FailingDataset(n, [0]),  # 100% of the first sample, 0.3% of the epoch
        workers=workers,
        on_error="skip",
        max_failures=0.01,
    ).result
    assert r["error"] == {}
    assert len(_indices(r)) == n - 1


@pytest.mark.parametrize("workers", WORKERS)
def test_fraction_over_the_limit_raises_after_probation(workers: int) -> None:
    n = 3 * PROBATION_SAMPLES
    bad = list(range(0, n, 20))  # 5% of the samples, spread over the epoch
    r = run_case(
        case_iterate,
        dataset=FailingDataset(n, bad),
        workers=workers,
        on_error="skip",
        max_failures=0.01,
    ).result
    err = r["error"]
    assert err["type"] == "FailureLimitError", err
    seen = len(_indices(r)) + len(r["failures"])
    # Not during probation (one failure in 20 samples would be over 1% from the start) ...
    slack = BATCH * 2 * max(1, workers)
    assert seen >= PROBATION_SAMPLES - slack, seen
    # ... and soon after it.
    assert seen <= PROBATION_SAMPLES + 20 + slack, seen
    assert "max_failures=0.01" in err["message"]


@pytest.mark.parametrize("workers", WORKERS)
def test_fraction_over_the_limit_raises_even_if_all_failures_came_early(workers: int) -> None:
    """5 failures in the first 5 samples of 300 are 1.7% > 1%: the limit is exceeded once
    probation ends, although no failure happens after it."""
    n = 3 * PROBATION_SAMPLES
    r = run_case(
        case_iterate,
        dataset=FailingDataset(n, range(5)),
        workers=workers,
        on_error="skip",
        max_failures=0.01,
    ).result
    assert r["error"].get("type") == "FailureLimitError", (
        f"5 of {n} samples failed (> 1%) and no error was raised; "
        f"{len(_indices(r))} samples delivered"
    )


# -- collate_fn ------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("max_failures", [2, 0.02])
def test_the_limit_holds_per_epoch_not_across_epochs(workers: int, max_failures: Any) -> None:
    """The same two bad files fail every epoch: 2 of 200 (1%) is within the limit each time,
    and a long run must not stop at the epoch where the total passes it."""
    n, bad = 2 * PROBATION_SAMPLES, [7, 150]
    r = run_case(
        case_iterate,
        dataset=FailingDataset(n, bad),
        workers=workers,
        epochs=3,
        on_error="skip",
        max_failures=max_failures,
    ).result
    assert r["error"] == {}, r["error"]
    assert [(f[0], f[1]) for f in r["failures"]] == [(i, e) for e in range(3) for i in bad]
    assert len(_indices(r)) == 3 * (n - 2)


@pytest.mark.parametrize("workers", WORKERS)
def test_a_fraction_is_enforced_at_the_end_of_an_epoch_shorter_than_probation(
    workers: int,
) -> None:
    # 3 of 40 (7.5%): probation never ends, so the epoch's end decides, against 5% and 10%.
    over, within = (
        run_case(
            case_iterate,
            dataset=FailingDataset(N, [1, 2, 30]),
            workers=workers,
            on_error="skip",
            max_failures=limit,
        ).result
        for limit in (0.05, 0.1)
    )
    err = over["error"]
    assert err.get("type") == "FailureLimitError", err
    assert "2.0 of 40 samples seen" in err["message"], err["message"]
    assert len(_indices(over)) == N - 3  # raised after the last batch, not before
    assert within["error"] == {}


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("on_error", ["skip", "replace"])
def test_an_epoch_where_every_sample_failed_raises_whatever_the_limit(
    workers: int, on_error: str
) -> None:
    r = run_case(
        case_iterate,
        dataset=FailingDataset(N, range(N)),
        workers=workers,
        on_error=on_error,
    ).result
    err = r["error"]
    assert err.get("type") == "FailureLimitError", err
    assert err["message"].startswith("every sample of epoch 0 failed to load"), err["message"]
    assert "sample 0 " in err["message"] and "loader.failures" in err["message"]
    assert r["batches"] == [] and err["listed"] and len(r["failures"]) >= N


@pytest.mark.parametrize("workers", WORKERS)
def test_collate_error_is_raised_with_worker_notes(workers: int) -> None:
    r = run_case(
        case_iterate,
        dataset=FailingDataset(N, []),
        workers=workers,
        collate_fn=FailingCollate([21]),
    ).result
    err = r["error"]
    assert err["type"] == "SampleError", err
    assert err["message"] == "cannot collate a batch holding samples [21]"
    assert _indices(r) == list(range(20))
    if workers:
        note = " ".join(err["notes"])
        assert "[20, 21, 22, 23]" in note and any(f"pid {p}" in note for p in r["pids"]), note


@pytest.mark.parametrize("workers", WORKERS)
def test_collate_error_with_skip_drops_that_batch_only(workers: int) -> None:
    r = run_case(
        case_iterate,
        dataset=FailingDataset(N, []),
        workers=workers,
        collate_fn=FailingCollate([21]),
        on_error="skip",
    ).result
    assert r["error"] == {}
    assert _indices(r) == [i for i in range(N) if not 20 <= i < 24]
    assert [(f[0], f[3]) for f in r["failures"]] == [([20, 21, 22, 23], "SampleError")]


# -- worker_init_fn --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failing", "delay_s"),
    [
        pytest.param(None, 0.0, id="every-worker"),
        pytest.param(1, 0.0, id="one-worker"),
        # The other worker loads the whole epoch before this one's init fails.
        pytest.param(1, 1.0, id="one-worker-late"),
    ],
)
def test_worker_init_fn_error_is_raised_in_the_main_process(
    failing: int | None, delay_s: float
) -> None:
    r = run_case(
        case_iterate,
        dataset=FailingDataset(N // 2, []),
        workers=2,
        worker_init_fn=FailingWorkerInit(failing, delay_s=delay_s),
    ).result
    err = r["error"]
    assert err, (
        f"worker_init_fn raised in worker {failing} but iteration ended normally with "
        f"{len(_indices(r))} samples"
    )
    assert err["type"] == "SampleError", err
    wid = 0 if failing is None else failing
    assert "worker_init_fn refuses worker" in err["message"]
    note = " ".join(err["notes"])
    assert "worker_init_fn" in note and "worker" in note.lower(), note
    if failing is not None:
        assert f"worker {wid}" in note, note


# -- __iter__ --------------------------------------------------------------------------------


@pytest.mark.parametrize("after", [0, 2], ids=["in-__iter__", "mid-stream"])
def test_iterable_error_is_raised_with_the_worker(after: int) -> None:
    r = run_case(
        case_iterate, dataset=FailingIterable(N, fail_worker=1, after=after), workers=2
    ).result
    err = r["error"]
    assert err["type"] == "SampleError", err
    assert "worker 1" in err["message"]
    note = " ".join(err["notes"])
    assert "worker 1" in note and f"pid {r['pids'][1]}" in note, note


def test_stats_of_an_iterable_dataset_loader() -> None:
    r = run_case(
        case_iterate,
        dataset=FailingIterable(N, fail_worker=1, after=2),
        workers=2,
        on_error="skip",
    ).result
    assert r["stats_error"] == "", r["stats_error"]
    assert r["stats_failures"] == 1


def test_iterable_error_in_the_main_process_is_raised() -> None:
    r = run_case(case_iterate, dataset=FailingIterable(N, fail_worker=0), workers=0).result
    assert r["error"]["type"] == "SampleError"
    assert r["batches"] == []


@pytest.mark.parametrize("after", [0, 2], ids=["in-__iter__", "mid-stream"])
def test_iterable_error_with_skip_is_recorded_and_the_rest_delivered(after: int) -> None:
    r = run_case(
        case_iterate,
        dataset=FailingIterable(N, fail_worker=1, after=after),
        workers=2,
        on_error="skip",
    ).result
    assert r["error"] == {}, r["error"]
    got = _indices(r)
    assert len(got) == len(set(got))
    # Worker 0's whole stream arrives; worker 1 stops at its failure.
    assert set(range(0, N, 2)) <= set(got)
    # ... with the items it yielded before (the rest of their batch is not lost with it).
    assert set(got) - set(range(0, N, 2)) == set(range(1, 2 * after, 2))
    assert len(r["failures"]) == 1
    f = r["failures"][0]
    assert f[2] == 1 and f[3] == "SampleError" and "worker 1" in f[4], f


@pytest.mark.parametrize("workers", WORKERS)
def test_a_stream_that_goes_on_after_a_bad_item_loses_only_that_item(workers: int) -> None:
    bad = [4, 5, 17]
    r = run_case(case_iterate, dataset=FlakyStream(N, bad), workers=workers, on_error="skip").result
    assert r["error"] == {}, r["error"]
    assert sorted(_indices(r)) == [i for i in range(N) if i not in bad]
    assert [f[0] for f in r["failures"]] == [None] * len(bad)
    assert sorted(f[4] for f in r["failures"]) == sorted(f"record {i} is corrupt" for i in bad)
    # Under "replace" the stream's next item fills the place: batches stay full until the end.
    r = run_case(
        case_iterate, dataset=FlakyStream(N, bad), workers=workers, on_error="replace"
    ).result
    assert r["error"] == {}, r["error"]
    assert sorted(_indices(r)) == [i for i in range(N) if i not in bad]
    sizes = [len(b) for b in r["batches"]]
    assert sizes.count(BATCH) >= len(sizes) - max(1, workers), sizes  # each stream's last
    assert {f[5] for f in r["failures"]} <= {"the stream's next item", None}


# -- corrupt JPEG files ----------------------------------------------------------------------

JPEGS = 30
TRUNCATED = [3, 17]
FLIPPED = [8, 29]
CORRUPT = sorted(TRUNCATED + FLIPPED)


@pytest.fixture
def jpeg_files(tmp_path: Path) -> list[Path]:
    paths = write_jpegs(tmp_path, JPEGS)
    for i in TRUNCATED:
        corrupt_truncate(paths[i])
    for i in FLIPPED:
        corrupt_bitflip(paths[i])
    # Ground truth, in this process: the corrupt files (and only they) fail to decode.
    ds = JpegFolder(paths)
    failing = []
    for i in range(JPEGS):
        try:
            ds[i]
        except Exception:
            failing.append(i)
    assert failing == CORRUPT
    return paths


def _expected_digests(paths: list[Path]) -> dict[int, str]:
    ds = JpegFolder(paths)
    return {i: _digest(ds[i][1]) for i in range(len(paths)) if i not in CORRUPT}


@pytest.mark.parametrize("workers", WORKERS)
def test_corrupt_jpegs_are_skipped_exactly(workers: int, jpeg_files: list[Path]) -> None:
    r = run_case(
        case_iterate, dataset=JpegFolder(jpeg_files), workers=workers, on_error="skip"
    ).result
    assert r["error"] == {}
    survivors = [i for i in range(JPEGS) if i not in CORRUPT]
    assert _indices(r) == survivors
    assert len(_indices(r)) == JPEGS - len(CORRUPT)
    # The survivors' pixels are exactly what Pillow decodes in this process.
    expected = _expected_digests(jpeg_files)
    assert {i: d for batch in r["batches"] for i, d in batch} == expected
    recorded = _fail_fields(r)
    assert [f[0] for f in recorded] == CORRUPT
    by_index = {f[0]: f for f in recorded}
    for i in TRUNCATED:
        assert by_index[i][1] == "OSError" and "truncated" in by_index[i][2], by_index[i]
    for i in FLIPPED:
        assert by_index[i][1] == "UnidentifiedImageError", by_index[i]
        assert f"img-{i:05d}.jpg" in by_index[i][2]


@pytest.mark.parametrize("workers", WORKERS)
def test_corrupt_jpegs_are_replaced_by_good_images(workers: int, jpeg_files: list[Path]) -> None:
    r = run_case(
        case_iterate,
        dataset=JpegFolder(jpeg_files),
        workers=workers,
        on_error="replace",
        drop_last=True,
    ).result
    assert r["error"] == {}
    assert [len(b) for b in r["batches"]] == [BATCH] * (JPEGS // BATCH)
    expected = _expected_digests(jpeg_files)
    for batch in r["batches"]:
        for i, digest in batch:
            assert i not in CORRUPT and expected[i] == digest


def test_corrupt_jpeg_with_raise_names_the_file_and_index(jpeg_files: list[Path]) -> None:
    r = run_case(case_iterate, dataset=JpegFolder(jpeg_files), workers=2).result
    err = r["error"]
    assert err["type"] == "OSError" and "truncated" in err["message"], err
    assert "[0, 1, 2, 3]" in " ".join(err["notes"])
    assert r["batches"] == []


@pytest.mark.parametrize("on_error", ["raise", "skip", "replace"])
def test_thread_workers_apply_each_policy_as_processes_do(on_error: str) -> None:
    """Threads share batches sample by sample (stoker.workers._board): what is delivered,
    recorded and raised must not change."""
    bad = [0, 5, 6, 7, 22]  # the first sample, most of a batch, one more
    runs = {
        backend: run_case(
            case_iterate,
            dataset=FailingDataset(N, bad),
            workers=2,
            on_error=on_error,
            backend=backend,
        ).result
        for backend in ("process", "thread")
    }
    process, thread = runs["process"], runs["thread"]
    assert thread["batches"] == process["batches"]
    assert _fail_fields(thread) == _fail_fields(process)
    assert thread["stats_failures"] == process["stats_failures"]
    assert {k: thread["error"].get(k) for k in ("type", "message", "listed")} == {
        k: process["error"].get(k) for k in ("type", "message", "listed")
    }
    if on_error == "raise":
        assert thread["error"]["type"] == "SampleError" and thread["batches"] == []
