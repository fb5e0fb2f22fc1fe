"""Promises stoker makes beyond torch's DataLoader (behaviour, observed from outside).

Persistent workers by default, epoch state reaching persistent workers, randomness that does
not depend on the worker count, kept batches never overwritten, ``in_order=False``, error
notes, thread capping, ``gc.freeze`` and clean shutdown.
"""

from __future__ import annotations

import gc
import inspect
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
import torch.utils.data as tud
from _datasets import (
    SLOW_SAMPLE_S,
    USER_SEED,
    EpochDataset,
    EpochSampler,
    FailingDataset,
    FilledDataset,
    GatedDataset,
    GrowingDataset,
    InfoDataset,
    RandomAugDataset,
    RangeDataset,
    ReverseSampler,
    SampleError,
    SeedReportDataset,
    SlowDataset,
    concat_collate,
    drawing_worker_init,
    failing_collate,
    failing_worker_init,
    identity_collate,
    numpy_keeping_collate,
    reseeding_worker_init,
)
from _support import assert_same, chunks, iterate_until_error, rebuild_like_lightning, to_lists

import stoker
from stoker._introspect.platform import usable_cores
from stoker.loader._settings import MAX_NICE, WORKER_NICE

HANG_GUARD_S = 120
# How long worker processes may take to exit once their loader or iterator is released.
SHUTDOWN_GRACE_S = 10.0
# How long a child interpreter may take to exit (it normally needs well under a second).
EXIT_TIMEOUT_S = 30.0
# Batches iterated after the kept ones in the slot-lifetime test.
MORE_BATCHES = 1000
SHM_DIR = "/dev/shm"
SHM_PREFIX = "stoker-"
TESTS_DIR = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.timeout(HANG_GUARD_S),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


def _loader(dataset: Any, workers: int = 2, start: str = "fork", **kwargs: Any) -> Any:
    return stoker.DataLoader(dataset, num_workers=workers, multiprocessing_context=start, **kwargs)


def _wait_dead(pids: list[int], grace: float = SHUTDOWN_GRACE_S) -> list[int]:
    """Wait until none of ``pids`` runs; return those still running after ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def _stoker_shm() -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIX)}
    except FileNotFoundError:
        return set()


# -- constructor surface -----------------------------------------------------------------------


def test_signature_extends_torch_with_same_defaults() -> None:
    ours = inspect.signature(stoker.DataLoader.__init__).parameters
    theirs = inspect.signature(tud.DataLoader.__init__).parameters
    for name, param in theirs.items():
        assert name in ours, f"stoker.DataLoader lacks torch's `{name}`"
        assert ours[name].kind == param.kind, name
        if name != "persistent_workers":
            assert ours[name].default == param.default, name
    extras = [n for n in ours if n not in theirs]
    assert all(ours[n].kind is inspect.Parameter.KEYWORD_ONLY for n in extras), extras


def test_every_constructor_argument_is_kept_as_an_attribute() -> None:
    """Trainers rebuild a loader from attributes named like ``__init__``'s parameters
    (torch keeps all of its own but ``shuffle``, which its sampler carries)."""
    loader = stoker.DataLoader(RangeDataset(4))
    params = inspect.signature(stoker.DataLoader.__init__).parameters
    missing = [n for n in params if n not in ("self", "shuffle") and not hasattr(loader, n)]
    assert missing == [], f"arguments a rebuilt loader would lose: {missing}"


def test_rebuilt_loader_keeps_the_error_policy() -> None:
    def outcome(loader: Any) -> Any:
        try:
            return to_lists(loader)
        except SampleError as exc:
            traceback.clear_frames(exc.__traceback__)
            return f"raised {exc}"

    loader = _loader(FailingDataset(12, bad=5), batch_size=2, on_error="skip")
    original = outcome(loader)
    assert [5] not in original and [4] in original
    assert outcome(rebuild_like_lightning(loader)) == original


@pytest.mark.parametrize("bad", [-1, "1", 1.0, True])
def test_set_epoch_rejects_non_int(bad: Any) -> None:
    loader = stoker.DataLoader(RangeDataset(4))
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(bad)


@pytest.mark.parametrize("bad", [0, 1.5, True, "2"])
def test_prefetch_factor_must_be_a_positive_int(bad: Any) -> None:
    # torch accepts 0 here and fails at iter(); stoker says what it takes when it is built.
    with pytest.raises(
        stoker.ConfigError, match=rf"`prefetch_factor` must be an int >= 1.*{bad!r}"
    ):
        stoker.DataLoader(RangeDataset(4), num_workers=1, prefetch_factor=bad)


# -- persistent workers ------------------------------------------------------------------------


def test_workers_persist_by_default() -> None:
    assert stoker.DataLoader(RangeDataset(4)).persistent_workers is False
    loader = _loader(EpochDataset(12), batch_size=3, collate_fn=identity_collate)
    assert loader.persistent_workers is True
    pids = []
    for _ in range(3):
        it = iter(loader)
        worker_pids = [w.pid for w in it._workers]
        samples = [s for batch in it for s in batch]
        assert [s[0] for s in samples] == list(range(12))
        assert {s[2] for s in samples} <= set(worker_pids)
        pids.append(worker_pids)
    assert pids[0] == pids[1] == pids[2]
    assert len(set(pids[0])) == 2


def test_explicit_persistent_workers_false_is_honoured() -> None:
    loader = _loader(
        EpochDataset(12), batch_size=3, collate_fn=identity_collate, persistent_workers=False
    )
    assert loader.persistent_workers is False
    pids = []
    for _ in range(2):
        it = iter(loader)
        worker_pids = [w.pid for w in it._workers]
        samples = [s for batch in it for s in batch]
        assert {s[2] for s in samples} <= set(worker_pids)
        pids.append(worker_pids)
        del it
        assert _wait_dead(worker_pids) == [], "an epoch's workers outlived their iterator"
    assert set(pids[0]).isdisjoint(pids[1])


def test_iterator_exposes_worker_handles() -> None:
    loader = _loader(RangeDataset(20), workers=3, batch_size=2)
    it = iter(loader)
    next(it)
    workers = it._workers
    assert isinstance(workers, list)
    assert len(workers) == 3
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    for w in workers:
        assert isinstance(w.pid, int)
        assert w.pid in children
        assert w.is_alive() is True
    rest = to_lists(it)
    assert rest == chunks(range(2, 20), 2, drop_last=False)


# -- epoch state -------------------------------------------------------------------------------


def test_loader_set_epoch_reaches_sampler_dataset_and_workers() -> None:
    dataset, sampler = EpochDataset(12), EpochSampler(12)
    loader = _loader(dataset, sampler=sampler, batch_size=3, collate_fn=identity_collate)
    for epoch in range(4):
        loader.set_epoch(epoch)
        assert sampler.epochs[-1] == epoch
        assert dataset.epoch == epoch
        samples = [s for batch in loader for s in batch]
        assert [s[0] for s in samples] == list(range(12))
        assert {s[1] for s in samples} == {epoch}, f"workers saw epochs {samples}"


def test_set_epoch_drives_distributed_sampler_order() -> None:
    dataset = RangeDataset(30)
    sampler = tud.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=4)
    loader = _loader(dataset, sampler=sampler, batch_size=5)
    orders = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        reference = tud.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=4)
        reference.set_epoch(epoch)
        order = [i for b in to_lists(loader) for i in b]
        assert order == list(reference)
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]


@pytest.mark.parametrize("kind", ["torch", "stoker"])
def test_dataset_set_epoch_in_main_process_reaches_persistent_workers(kind: str) -> None:
    """The seed articles' pattern; torch's persistent workers keep a stale dataset copy."""
    dataset = EpochDataset(12)
    dataset.set_epoch(0)
    cls = tud.DataLoader if kind == "torch" else stoker.DataLoader
    loader = cls(
        dataset,
        batch_size=3,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
        collate_fn=identity_collate,
    )
    seen = []
    for epoch in range(3):
        loader.dataset.set_epoch(epoch)
        seen.append({s[1] for batch in loader for s in batch})
    if kind == "stoker":
        assert seen == [{0}, {1}, {2}]
    else:  # the difference stoker fixes, proven on torch itself
        assert seen == [{0}, {0}, {0}]


# -- randomness --------------------------------------------------------------------------------


def _random_epochs(workers: int, seed: int = 77, **kwargs: Any) -> list[list[Any]]:
    loader = _loader(
        RandomAugDataset(24),
        workers=workers,
        batch_size=4,
        collate_fn=identity_collate,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
    return [sorted(s for b in loader for s in b) for _ in range(2)]


def test_randomness_independent_of_worker_count_and_dispatch() -> None:
    one, two, three = _random_epochs(1), _random_epochs(2), _random_epochs(3)
    assert [s[0] for s in one[0]] == list(range(24))
    assert one == two == three
    assert _random_epochs(2, in_order=False) == one
    # Not constant: every sample of an epoch draws differently, and epochs differ.
    draws = [s[1:] for s in one[0]]
    assert len(set(draws)) == len(draws)
    for a, b in zip(one[0], one[1], strict=True):
        assert a[1:] != b[1:], f"sample {a[0]} drew the same values in epochs 0 and 1"
    assert _random_epochs(2, seed=78)[0] != one[0]


def test_seeds_set_in_worker_init_fn_are_followed_for_any_worker_count() -> None:
    """A ``worker_init_fn`` that seeds the generators with fixed seeds: ``__getitem__`` sees
    ``torch.initial_seed()`` as set, and the draws follow those seeds, the same for 1, 2 or 3
    workers and whatever the loader's seed, each batch its own (under torch every worker
    would repeat the same draws)."""

    def run(workers: int, seed: int = 77) -> list[list[Any]]:
        loader = _loader(
            SeedReportDataset(24),
            workers=workers,
            batch_size=4,
            collate_fn=identity_collate,
            generator=torch.Generator().manual_seed(seed),
            worker_init_fn=reseeding_worker_init,
        )
        return [sorted(s for b in loader for s in b) for _ in range(2)]

    one = run(1)
    assert [s[0] for s in one[0]] == list(range(24))
    assert {s[1] for epoch in one for s in epoch} == {USER_SEED}
    assert run(3) == one
    assert run(2, seed=78) == one
    draws = [s[2:] for s in one[0]]
    assert len(set(draws)) == len(draws)
    for a, b in zip(one[0], one[1], strict=True):
        assert a[2:] != b[2:], f"sample {a[0]} drew the same values in epochs 0 and 1"
    for d, (r, n) in zip(draws, (s[2:] for s in _random_epochs(1)[0]), strict=True):
        assert d[1] != r and d[2] != n, "random and numpy follow the loader's seed, not theirs"


def test_a_worker_init_fn_that_only_draws_leaves_the_seeds_to_stoker() -> None:
    assert _random_epochs(2, worker_init_fn=drawing_worker_init) == _random_epochs(1)


# -- slot lifetime -----------------------------------------------------------------------------


def _check_batch(batch: dict[str, Any], shape: tuple[int, ...]) -> None:
    for j, index in enumerate(batch["i"]):
        assert torch.equal(batch["x"][j], torch.full(shape, float(index))), index
        assert np.array_equal(batch["a"][j], np.full((7,), index, dtype=np.int64)), index


def test_kept_batches_stay_intact_after_many_more() -> None:
    shape = (3, 16, 16)
    loader = _loader(FilledDataset(64, shape), batch_size=4, collate_fn=numpy_keeping_collate)
    kept: list[tuple[str, Any, list[int]]] = []
    delivered = 0
    while delivered < MORE_BATCHES + 8:
        for batch in loader:
            _check_batch(batch, shape)
            if delivered == 0:
                kept.append(("whole", batch, batch["i"]))
            elif delivered == 1:
                kept.append(("tensor", batch["x"], batch["i"]))
            elif delivered == 2:
                kept.append(("row-view", batch["x"][1], batch["i"][1:2]))
            elif delivered == 3:
                kept.append(("strided-view", batch["x"][::2, 1], batch["i"][::2]))
            elif delivered == 4:
                kept.append(("array", batch["a"], batch["i"]))
            elif delivered == 5:
                kept.append(("array-view", batch["a"][2:], batch["i"][2:]))
            delivered += 1
    gc.collect()
    for what, obj, indices in kept:
        if what == "whole":
            _check_batch(obj, shape)
        elif what == "tensor":
            assert torch.equal(obj, torch.stack([torch.full(shape, float(i)) for i in indices]))
        elif what == "row-view":
            assert torch.equal(obj, torch.full(shape, float(indices[0])))
        elif what == "strided-view":
            assert torch.equal(obj, torch.stack([torch.full(shape[1:], float(i)) for i in indices]))
        else:
            expected = np.stack([np.full((7,), i, dtype=np.int64) for i in indices])
            assert np.array_equal(obj, expected), what


def test_large_batches_after_small_ones_and_back() -> None:
    dataset = GrowingDataset(12, base=20_000)  # last batch ~ 35 MB of float32
    loader = _loader(dataset, batch_size=4, collate_fn=concat_collate)
    expected = [concat_collate([dataset[i] for i in b]) for b in chunks(range(12), 4, False)]
    kept = []
    for _ in range(3):
        got = list(loader)
        assert len(got) == 3
        for a, e in zip(got, expected, strict=True):
            assert_same(a, e)
        kept.append(got[-1])
    for batch in kept:
        assert_same(batch, expected[-1])


def test_batches_over_the_slot_budget_fall_back_intact(monkeypatch: pytest.MonkeyPatch) -> None:
    import stoker.loader._start as engine

    monkeypatch.setattr(engine, "MIN_SLOT_BUDGET", 1 << 20)
    monkeypatch.setattr(engine, "SHM_BUDGET_FRACTION", 0.0)
    dataset = GrowingDataset(12, base=2_000)  # batches of ~0.2, ~1.4 and ~3.6 MB
    loader = _loader(dataset, batch_size=4, collate_fn=concat_collate)
    expected = [concat_collate([dataset[i] for i in b]) for b in chunks(range(12), 4, False)]
    kept = []
    for _ in range(3):
        got = list(loader)
        assert len(got) == 3
        for a, e in zip(got, expected, strict=True):
            assert_same(a, e)
        kept.extend(got)
    assert loader.stats().fallback_batches > 0, "no batch took the fallback path"
    for i, batch in enumerate(kept):
        assert_same(batch, expected[i % 3])


# -- delivery order ----------------------------------------------------------------------------


def test_in_order_false_lets_later_batches_overtake_a_held_one(tmp_path: Path) -> None:
    gate = tmp_path / "batch-0-may-finish"
    loader = _loader(GatedDataset(24, gated=[0], gate=str(gate)), batch_size=4, in_order=False)
    got = []
    for batch in loader:
        got.append(batch.tolist())
        gate.touch()  # batch 0 is held until the main process has received another batch
    expected = chunks(range(24), 4, drop_last=False)
    assert sorted(got) == expected
    assert got[0] != expected[0], "in_order=False waited for the held first batch"


def test_in_order_true_waits_for_a_slow_batch() -> None:
    loader = _loader(SlowDataset(24, slow=[0], delay=SLOW_SAMPLE_S), batch_size=4)
    assert to_lists(loader) == chunks(range(24), 4, drop_last=False)


# -- errors ------------------------------------------------------------------------------------


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def _ints(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\d+", text)}


def test_worker_error_keeps_type_and_names_worker_pid_and_indices() -> None:
    loader = _loader(FailingDataset(12, bad=9), batch_size=4, sampler=ReverseSampler(12))
    exc, seen = iterate_until_error(loader, SampleError)
    assert type(exc) is SampleError
    match = re.search(r"worker=(\d+) pid=(\d+)", str(exc))
    assert match, str(exc)
    worker_id, pid = int(match[1]), int(match[2])
    notes = _notes(exc)
    assert "worker" in notes.lower() and "pid" in notes.lower(), notes
    assert {worker_id, pid, 11, 10, 9, 8} <= _ints(notes), notes
    assert to_lists(seen) == []
    text = "".join(traceback.format_exception(exc))
    assert "_datasets.py" in text and "__getitem__" in text, "worker traceback missing"


def test_collate_error_in_worker_names_the_worker() -> None:
    loader = _loader(RangeDataset(6), batch_size=3, collate_fn=failing_collate)
    exc, _ = iterate_until_error(loader, SampleError)
    assert "collate_fn refused a batch of 3" in str(exc)
    notes = _notes(exc)
    assert "worker" in notes.lower(), notes
    assert {0, 1, 2} <= _ints(notes) or {3, 4, 5} <= _ints(notes), notes


def test_worker_init_fn_error_names_the_worker() -> None:
    loader = _loader(RangeDataset(6), batch_size=3, worker_init_fn=failing_worker_init)
    exc, _ = iterate_until_error(loader, SampleError)
    assert "worker_init_fn refused worker" in str(exc)
    assert "worker" in _notes(exc).lower()


# -- threads and copy-on-read ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "start"),
    [(1, "fork"), (2, "fork"), (3, "fork"), pytest.param(2, "spawn", marks=pytest.mark.slow)],
)
def test_workers_cap_threads_and_freeze_gc(workers: int, start: str) -> None:
    cores = usable_cores()
    main_threads = torch.get_num_threads()
    loader = _loader(
        InfoDataset(12), workers=workers, start=start, batch_size=2, collate_fn=identity_collate
    )
    samples = [s for batch in loader for s in batch]
    assert len(samples) == 12
    for s in samples:
        threads = s["num_threads"]
        assert threads >= 1
        assert workers * threads <= cores or threads == 1, (workers, threads, cores)
        if start == "fork":
            assert s["gc_freeze_count"] > 0, "gc.freeze() was not called before forking"
    assert torch.get_num_threads() == main_threads, "the main process's threads changed"


class NiceDataset(tud.Dataset[int]):
    """Each sample is the nice value of the thread that loads it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.parametrize(
    ("backend", "nice", "added"),
    [("process", None, WORKER_NICE), ("process", 0, 0), ("process", 5, 5), ("thread", None, 0)],
)
def test_process_workers_run_at_a_lower_priority_than_the_training_process(
    backend: str, nice: int | None, added: int
) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    extra = {} if nice is None else {"worker_nice": nice}
    loader = stoker.DataLoader(NiceDataset(), batch_size=2, num_workers=2, backend=backend, **extra)
    seen = {int(v) for batch in loader for v in batch}
    assert seen == {min(MAX_NICE, own + added)}
    assert os.getpriority(os.PRIO_PROCESS, 0) == own, "the training process's priority changed"


def test_a_single_forked_worker_does_not_hang_in_openmp_after_the_parent_used_it() -> None:
    """libgomp is not fork-safe: a forked worker given more than one intra-op thread hung in
    its first parallel torch op once the parent had run an OpenMP team (seen in the bench:
    ``num_workers="auto"`` starting from 1 worker on 2 cores, LargeDataset's ``clone()``)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import torch, stoker
        from stoker.bench._synthetic import LargeDataset

        if __name__ == "__main__":
            torch.set_num_threads(2)
            x = torch.rand(3, 224, 224 * 64)
            for _ in range(20):
                x.clone()  # a parallel region: the parent's OpenMP team now exists
            loader = stoker.DataLoader(LargeDataset(256), batch_size=8, num_workers=1)
            print(sum(b.shape[0] for b in loader))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "256"


# -- shutdown ----------------------------------------------------------------------------------


def test_break_then_release_persistent_loader_stops_workers() -> None:
    loader = _loader(RangeDataset(100), batch_size=2)
    it = iter(loader)
    for i, _ in enumerate(it):
        if i == 2:
            break
    pids = [w.pid for w in it._workers]
    del it, loader
    gc.collect()
    assert _wait_dead(pids) == []


@pytest.mark.measures  # asserts how long the shutdown took
@pytest.mark.parametrize("backend", ["process", "thread"])
def test_shutdown_gives_up_the_batches_in_flight_instead_of_finishing_them(backend: str) -> None:
    # Batch 0 loads at once; every later batch takes BATCH * delay to finish.
    batch, delay = 20, SLOW_SAMPLE_S / 10
    loader = _loader(
        SlowDataset(100, slow=range(batch, 100), delay=delay), batch_size=batch, backend=backend
    )
    it = iter(loader)
    assert next(it).tolist() == list(range(batch))
    t0 = time.monotonic()
    it._shutdown()
    # Workers stop after the sample they are on (one delay), not after their batch.
    assert time.monotonic() - t0 < batch * delay / 2


def test_break_then_del_iterator_stops_fresh_workers() -> None:
    loader = _loader(
        SlowDataset(100, slow=range(10, 100), delay=SLOW_SAMPLE_S / 10),
        batch_size=2,
        persistent_workers=False,
    )
    it = iter(loader)
    next(it)
    pids = [w.pid for w in it._workers]
    del it
    assert _wait_dead(pids) == []
    # The loader still works: a new epoch starts new workers.
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    assert {w.pid for w in it._workers}.isdisjoint(pids)
    pids = [w.pid for w in it._workers]
    del it
    assert _wait_dead(pids) == []


def test_iterator_in_a_reference_cycle_is_collected() -> None:
    loader = _loader(RangeDataset(50), batch_size=2, persistent_workers=False)
    it = iter(loader)
    next(it)
    pids = [w.pid for w in it._workers]
    cycle: list[Any] = [it]
    cycle.append(cycle)
    del it, cycle
    gc.collect()
    assert _wait_dead(pids) == []


_EXIT_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import stoker
    from _datasets import FilledDataset, SlowDataset

    if __name__ == "__main__":
        start, mode = sys.argv[2], sys.argv[3]
        if mode == "busy":
            # Workers are asleep in __getitem__ at exit: exiting must not wait for them.
            dataset = SlowDataset(64, slow=range(4, 64), delay=600.0)
        else:
            dataset = FilledDataset(64)
        loader = stoker.DataLoader(dataset, batch_size=4, num_workers=2,
                                   multiprocessing_context=start)
        it = iter(loader)
        kept = [next(it) for _ in range(1 if mode == "busy" else 3)]
        print("PIDS", *[w.pid for w in it._workers], flush=True)
        if mode == "raise":
            raise RuntimeError("boom from the training loop")
    """
)


@pytest.mark.parametrize(
    ("start", "mode"),
    [
        ("fork", "exit"),
        ("fork", "raise"),
        ("fork", "busy"),
        pytest.param("spawn", "exit", marks=pytest.mark.slow),
    ],
)
def test_interpreter_exit_without_cleanup_is_clean(start: str, mode: str) -> None:
    # The child keeps its slots in a private directory, so that loaders of other processes
    # sharing this machine's /dev/shm cannot be mistaken for its leftovers.
    private_shm = tempfile.mkdtemp(dir=SHM_DIR, prefix="loader-exit-test-")
    shm_before = _stoker_shm()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _EXIT_SCRIPT, str(TESTS_DIR), start, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "STOKER_SHM_DIR": private_shm},
        )
        try:
            out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"child did not exit within {EXIT_TIMEOUT_S} s; stderr:\n{err}")
        pid_lines = [line for line in out.splitlines() if line.startswith("PIDS")]
        assert pid_lines, f"child printed no worker pids; stderr:\n{err}"
        pids = [int(p) for p in pid_lines[0].split()[1:]]
        alive = _wait_dead(pids)
        if alive:
            for pid in alive:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"workers {alive} outlived their interpreter")
        if mode == "raise":
            assert proc.returncode == 1
            assert "boom from the training loop" in err
            err = err.split("RuntimeError: boom from the training loop")[-1]
        else:
            assert proc.returncode == 0, err
        assert "leaked" not in err.lower(), err
        assert "warning" not in err.lower(), err
        assert "Traceback" not in err, err
        assert os.listdir(private_shm) == [], "shared memory left behind"
        # Anything the child created outside the private directory would name its pid.
        owned = {str(proc.pid), *map(str, pids)}
        strays = {n for n in _stoker_shm() - shm_before if owned & set(n.split("-"))}
        assert strays == set(), f"shared memory left in {SHM_DIR}"
    finally:
        shutil.rmtree(private_shm, ignore_errors=True)


# -- workers leaving on request (num_workers="auto") -------------------------------------------


def test_a_worker_retiring_with_batches_in_flight_loses_none_and_leaks_nothing() -> None:
    """A worker asked to leave right after handing batches over, before the main process read
    their headers, used to unlink their slots on its way out: delivery then failed with
    FileNotFoundError (seen with num_workers="auto" taking back a worker)."""
    import time

    import stoker

    data = torch.arange(64 * 1024, dtype=torch.float32).reshape(64, 1024)
    loader = stoker.DataLoader(data, batch_size=4, num_workers=2, prefetch_factor=4)
    it = iter(loader)
    got = [next(it)]
    pool = it._pool
    pool.retire()  # white-box: what the auto controller does
    time.sleep(0.5)  # the idle worker sends its batches, takes the request and exits unread
    got += list(it)
    assert torch.equal(torch.cat(got), data)
    assert len(pool.retired) == 1
    del it, got
    gc.collect()


class _SlowItems(tud.Dataset):
    """Each sample takes 0.3 s: workers stay busy while the test looks at the task queue."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        time.sleep(0.3)
        return i


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_retire_requests_go_ahead_of_queued_tasks(backend: str) -> None:
    """Behind queued tasks, a retiring worker would first load every batch already queued
    (seconds on an oversubscribed pool) while the controller waits for it to leave."""
    import stoker
    from stoker.workers._loop import RETIRE

    loader = stoker.DataLoader(
        _SlowItems(), batch_size=1, num_workers=2, prefetch_factor=4, backend=backend
    )
    it = iter(loader)
    pool = it._pool
    time.sleep(0.1)  # both workers busy with a sample; six tasks queued
    pool.retire(1)
    if backend == "process":
        queued = pool.queue.drain()
        for raw in queued:
            pool.queue.put(raw)
    else:
        queued = []
        while not pool.tasks.empty():
            queued.append(pool.tasks.get_nowait())
        for msg in queued:
            pool.tasks.put(msg)
    assert queued[0] == RETIRE and RETIRE not in queued[1:] and len(queued) >= 4, queued
    assert [int(b) for b in it] == list(range(8))  # nothing lost, order kept
    assert len(pool.retired) == 1
    del it
    gc.collect()


class _GatedLog(tud.Dataset):
    """Logs every index it loads (a file: worker processes too); index ``gated`` says it was
    reached (``gate + ".reached"``) and waits until the gate file exists."""

    def __init__(self, log: str, gate: str, gated: int) -> None:
        self.log, self.gate, self.gated = log, gate, gated

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        if i == self.gated:
            Path(self.gate + ".reached").touch()
        deadline = time.monotonic() + 20
        while i == self.gated and not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.005)
        with open(self.log, "a") as f:
            f.write(f"{i}\n")
        return i


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("backend", ["process", "thread"])
def test_a_batch_of_an_abandoned_epoch_is_given_up_at_its_next_sample(
    backend: str, on_error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an early `break`, a worker finishing the batch it held would make the next
    epoch's first batch wait (a whole batch on a slow dataset); it gives the batch up at the
    next sample instead, and the next epoch is whole."""
    import stoker
    from stoker.workers import _fetch

    monkeypatch.setattr(_fetch, "STOP_CHECK_S", 0.0)  # check between every two samples

    log, gate = str(tmp_path / "log"), str(tmp_path / "gate")
    loader = stoker.DataLoader(
        _GatedLog(log, gate, gated=5),
        batch_size=4,
        num_workers=1,
        backend=backend,
        on_error=on_error,
    )
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    deadline = time.monotonic() + 10
    while not os.path.exists(gate + ".reached") and time.monotonic() < deadline:
        time.sleep(0.005)  # until the worker is inside sample 5 of batch 1
    del it  # break: the epoch is abandoned
    it = iter(loader)  # a new epoch: batch 1 of the last one is given up after sample 5
    Path(gate).touch()
    assert [b.tolist() for b in it] == [list(range(i, i + 4)) for i in range(0, 16, 4)]
    loaded = [int(x) for x in Path(log).read_text().split()]
    assert loaded[:6] == [0, 1, 2, 3, 4, 5] and loaded[6:] == list(range(16)), loaded
    del it, loader
    gc.collect()


class _SlowLog(tud.Dataset):
    """Logs every index it loads (a file: worker processes too), each after ``delay`` s."""

    def __init__(self, log: str, n: int, delay: float) -> None:
        self.log, self.n, self.delay = log, n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        with open(self.log, "a") as f:
            f.write(f"{i}\n")
        return i


# How long the log of loaded samples must stay unchanged for the workers to count as idle.
QUIET_S = 0.3


def _loaded_when_quiet(log: Path) -> list[int]:
    """The indices logged once the log stopped growing for QUIET_S (10 s at most)."""
    last, since, deadline = None, time.monotonic(), time.monotonic() + 10
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if text != last:
            last, since = text, time.monotonic()
        elif time.monotonic() - since >= QUIET_S:
            break
        time.sleep(0.01)
    return [int(x) for x in (last or "").split()]


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_a_loop_that_breaks_lets_the_persistent_workers_go_idle(
    backend: str, tmp_path: Path
) -> None:
    """torch's persistent workers load every prefetched batch of an abandoned epoch (CPU
    that the loop wanted for what it does after the `break`); stoker's finish the batch each
    is on and stop. The next epoch, and a resume from where the loop left, are whole."""
    workers, batch, prefetch = 2, 2, 8
    log = tmp_path / "log"
    loader = stoker.DataLoader(
        _SlowLog(str(log), 64, delay=0.01),
        batch_size=batch,
        num_workers=workers,
        prefetch_factor=prefetch,
        backend=backend,
    )
    for b in loader:
        assert b.tolist() == [0, 1]
        break  # 16 batches were asked for; the workers were on at most one each
    at_break = len(log.read_text().split())
    state = loader.state_dict()
    loaded = _loaded_when_quiet(log)
    assert len(loaded) - at_break <= workers * batch, (at_break, loaded)
    assert len(loaded) < prefetch * workers * batch // 2, loaded
    # The next epoch is whole and in order.
    assert [b.tolist() for b in loader] == [[i, i + 1] for i in range(0, 64, 2)]
    # A resume from the break delivers the rest of that epoch.
    resumed = stoker.DataLoader(
        _SlowLog(str(tmp_path / "log2"), 64, delay=0.0),
        batch_size=batch,
        num_workers=workers,
        prefetch_factor=prefetch,
        backend=backend,
    )
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[i, i + 1] for i in range(2, 64, 2)]
    del loader, resumed
    gc.collect()


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_an_epoch_let_go_and_then_iterated_on_is_whole(backend: str) -> None:
    """The handle on an epoch forwards to the persistent iterator; if the iterator let go
    of the epoch (its tasks taken back) and the epoch is then iterated on after all, the
    tasks go out again and nothing is lost or reordered."""
    loader = _loader(RangeDataset(40), batch_size=2, backend=backend, prefetch_factor=4)
    it = iter(loader)
    assert iter(it) is it and len(it) == 20
    assert next(it).tolist() == [0, 1]
    inner = loader._iterator
    assert it._pool is inner._pool  # other attributes are the iterator's
    inner.let_go(inner._generation)
    assert [b.tolist() for b in it] == [[i, i + 1] for i in range(2, 40, 2)]
    # A handle of an earlier epoch that is dropped leaves the current epoch alone.
    old = iter(loader)
    new = iter(loader)
    assert next(new).tolist() == [0, 1]
    del old
    assert inner._ctx.let_go == []
    assert [b.tolist() for b in new] == [[i, i + 1] for i in range(2, 40, 2)]
    del it, new, loader, inner
    gc.collect()


class _Napping(tud.Dataset):
    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> int:
        time.sleep(0.005)
        return i


@pytest.mark.measures  # the window widens on cores measured idle
def test_an_auto_pool_started_larger_than_the_cores_starts_one_batch_per_core(monkeypatch):
    """All at once, 16 workers on 2 cores finish their first batches late together; a slow
    start hands out one batch per core to as many workers, then widens as cores sit idle,
    starting more, and lifts."""
    import stoker
    from stoker._introspect.platform import usable_cores
    from stoker.autotune import _scaling

    cores = usable_cores()
    monkeypatch.setattr(_scaling, "CONTROL_INTERVAL_S", 0.02)
    monkeypatch.setattr(_scaling, "SLOW_START_INTERVALS", 4)
    loader = stoker.DataLoader(_Napping(), batch_size=2, num_workers="auto", backend="process")
    loader._start_with(cores + 2)
    it = iter(loader)
    try:
        scaler, pool = it._scaler, it._pool
        assert scaler is not None and scaler.window == cores
        assert it._ctx.book.outstanding == cores
        assert len(pool.active) == cores and scaler.deferred == 2  # the other two wait
        assert f"slow start: {cores} of {cores + 2} workers started" in " ".join(it._notes)
        assert [int(x) for b in it for x in b] == list(range(200))
        assert scaler.window is None and scaler.deferred == 0  # lifted
        # The samples wait (cores sat idle): the window widened and started the deferred ones.
        assert len(pool.processes) > cores, it._notes
    finally:
        it._shutdown()  # (a failed assertion's traceback would keep the workers alive)
    del it
    gc.collect()


class _Busy(tud.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        end = time.perf_counter() + 0.004
        while time.perf_counter() < end:
            pass
        return i


@pytest.mark.measures  # asserts a decision from cores measured busy
def test_a_slow_start_on_busy_cores_never_starts_the_deferred_workers(monkeypatch):
    import stoker
    from stoker._introspect.platform import usable_cores
    from stoker.autotune import _scaling

    cores = usable_cores()
    monkeypatch.setattr(_scaling, "CONTROL_INTERVAL_S", 0.02)
    loader = stoker.DataLoader(_Busy(), batch_size=2, num_workers="auto", backend="process")
    loader._start_with(cores + 6)
    it = iter(loader)
    try:
        pool = it._pool
        assert [int(x) for b in it for x in b] == list(range(64))
        assert len(pool.processes) <= cores + 1, it._notes  # CPU work: no idle cores to fill
    finally:
        it._shutdown()  # (a failed assertion's traceback would keep the workers alive)
    del it
    gc.collect()


class _Wide(tud.Dataset):
    """Samples of 256 KiB: every batch travels in a shared-memory slot."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((65_536,), float(i))


def test_batches_in_freshly_created_slots_do_not_size_the_prefetch_depth(monkeypatch):
    """A batch its worker collated into a slot it had just created paid for the slot (a file,
    a mapping, the first touch of each page): a one-off cost that must not pass for the
    latency spread the prefetch depth absorbs. Every other batch's latency is recorded."""
    import stoker
    from stoker.autotune import _scaling

    recorded: list[float] = []
    monkeypatch.setattr(_scaling.AutoScaler, "record_latency", lambda self, s: recorded.append(s))
    loader = stoker.DataLoader(_Wide(), batch_size=2, num_workers="auto", backend="process")
    it = iter(loader)
    try:
        assert it._scaler is not None
        delivered = 0
        for batch in it:
            assert batch[:, 0].tolist() == [2.0 * delivered, 2.0 * delivered + 1]
            delivered += 1
            del batch
        created = len(it._slots)
        assert delivered == 24 and 0 < created < delivered
        assert len(recorded) == delivered - created
    finally:
        it._shutdown()
        del it
        gc.collect()


def test_the_controller_takes_in_the_replies_that_arrived_before_it_measures(monkeypatch):
    """Replies are taken in when the consumer finds no batch ready; a thread pool ahead of
    the consumer would otherwise report a whole break's busy time in a later interval (0%
    busy, then over 100%). When the controller measures, none is left waiting."""
    import stoker

    loader = stoker.DataLoader(
        RangeDataset(400), batch_size=4, num_workers="auto", backend="thread"
    )
    it = iter(loader)
    next(it)
    pool, scaler = it._pool, it._scaler
    assert pool is not None and scaler is not None and pool.kind == "thread"
    deadline = time.monotonic() + 10.0
    while pool.results.empty() and time.monotonic() < deadline:
        time.sleep(0.01)  # the consumer away: the threads load ahead
    assert not pool.results.empty()
    measured: list[float] = []
    real_step = scaler.step

    def step(pool_: Any, **kwargs: Any) -> Any:
        measured.append(kwargs["busy_s"])
        return real_step(pool_, **kwargs)

    monkeypatch.setattr(scaler, "due", lambda now=None: True)
    monkeypatch.setattr(scaler, "step", step)
    busy_before = float(sum(it._replies.worker_busy.values()))
    it._control()
    # The replies that waited were taken in first: their busy time is in the measurement
    # (threads may add one more meanwhile, so the queue's emptiness is not asserted).
    assert measured and measured[0] > busy_before
    monkeypatch.undo()  # the controller on its own clock again for the rest of the epoch
    assert sorted(int(x) for b in it for x in b) == list(range(4, 400))
    del it
    gc.collect()
