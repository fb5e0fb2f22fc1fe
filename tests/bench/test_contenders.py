"""Contender configurations: names, merging of identical ones, optional libraries."""

from __future__ import annotations

import threading
import time

import pytest
import torch.utils.data as tud

from stoker.bench._contenders import (
    OPTIONAL,
    PEER_ORDER_NOTES,
    ContenderSpec,
    build_loader,
    close_loader,
    installed_peers,
    merge,
    recommended_workers,
    standard_contenders,
)
from stoker.bench._synthetic import TinyDataset


def test_recommended_workers_is_seventy_percent_of_cores() -> None:
    assert [recommended_workers(n) for n in (1, 2, 4, 8, 16)] == [1, 1, 3, 6, 11]


def test_names_show_what_differs() -> None:
    assert ContenderSpec("torch", 0).name == "torch nw=0"
    assert ContenderSpec("torch", 2, 4, True).name == "torch nw=2 pf=4"
    assert ContenderSpec("torch", 2, 2, False).name == "torch nw=2 pf=2 fresh"
    assert ContenderSpec("stoker", 2).name == "stoker nw=2"


def test_merge_joins_roles_of_identical_configurations() -> None:
    best = ContenderSpec("torch", 2, 2, True)
    specs = merge(standard_contenders(cores=2, stoker_workers=2, best=best, same_prefetch=2))
    names = [s.name for s in specs]
    # stoker first, then the same-workers comparison, then torch's other references
    assert names == ["stoker nw=2", "torch nw=2 pf=2", "torch nw=0", "torch nw=1 pf=4"]
    assert specs[1].roles == ("torch-same", "torch-best")
    with_auto = merge(standard_contenders(2, 2, best, 2, stoker_auto=True))
    assert [s.name for s in with_auto][:3] == ["stoker auto", "stoker nw=2", "torch nw=2 pf=2"]


def test_best_at_zero_workers_merges_with_the_baseline() -> None:
    specs = merge(standard_contenders(2, 2, ContenderSpec("torch", 0), 4))
    assert specs[2].name == "torch nw=0" and specs[2].roles == ("torch-best", "torch-nw0")
    assert [s.name for s in specs][1] == "torch nw=2 pf=4"


def test_missing_optional_libraries_are_noted_not_run() -> None:
    import pytest

    peers, notes = installed_peers()
    assert set(peers) | {n.split()[0] for n in notes} == set(OPTIONAL)
    for note in notes:
        assert note.endswith(": not compared")
    mp = pytest.MonkeyPatch()
    try:  # a peer that is not installed, and one whose module fails to import
        mp.setitem(OPTIONAL, "nosuchlib", ("nosuchlib_xyz.pipeline", OPTIONAL["spdl"][1]))
        mp.setitem(OPTIONAL, "broken", ("json.no_such_module", OPTIONAL["spdl"][1]))
        peers, notes = installed_peers()
    finally:
        mp.undo()
    assert "nosuchlib" not in peers and "broken" not in peers
    assert "nosuchlib not installed (pip install 'stoker[bench]'): not compared" in notes
    assert any(n.startswith("broken does not import (ModuleNotFoundError") for n in notes)


def test_build_loader_makes_torch_and_stoker_loaders() -> None:
    ds = TinyDataset(n=64)
    torch_loader = build_loader(ContenderSpec("torch", 0), ds, 16, range(64))
    assert isinstance(torch_loader, tud.DataLoader)
    assert sum(b.shape[0] for b in torch_loader) == 64
    close_loader(torch_loader)
    from stoker import DataLoader

    stoker_loader = build_loader(ContenderSpec("stoker", 0), ds, 16, range(64))
    assert isinstance(stoker_loader, DataLoader)


def test_auto_contender_is_the_loader_a_user_builds_without_a_timeout() -> None:
    # A timeout keeps num_workers="auto"'s first batch out of the main process: the bench
    # would time a start a user who follows the README does not get.
    from stoker.loader._main_first import MainFirst

    ds = TinyDataset(n=64)
    auto = build_loader(ContenderSpec("stoker", 2, auto=True), ds, 16, range(64))
    fixed = build_loader(ContenderSpec("stoker", 2), ds, 16, range(64))
    assert auto.timeout == 0 and MainFirst.eligible(auto)
    assert fixed.timeout > 0  # (a hung worker fails its contender, not the bench)
    assert sum(len(b) for b in auto) == 64
    close_loader(auto)
    close_loader(fixed)


def test_full_mode_adds_auto_and_watched_stoker() -> None:
    from stoker.bench._contenders import build_loader, close_loader, standard_contenders

    specs = standard_contenders(2, 2, None, 2, stoker_auto=True, stoker_watched=True)
    by_role = {r: s for s in specs for r in s.roles}
    assert by_role["stoker-auto"].name == "stoker auto"
    assert by_role["stoker-auto"].config["num_workers"] == "auto"
    watched = by_role["stoker-watched"]
    assert watched.name == "stoker nw=2 watched"
    loader = build_loader(watched, list(range(8)), 4, None)
    batches = [b.tolist() for b in loader]
    assert type(loader).__name__ == "Watch" and batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    close_loader(loader)
    quick = standard_contenders(2, 2, None, 2)
    assert not any({"stoker-auto", "stoker-watched"} & set(s.roles) for s in quick)


def test_peer_grids_are_no_larger_than_torchs_and_use_their_own_knobs() -> None:
    import dataclasses

    from stoker.bench import make_plan

    plan = make_plan(quick=False, cores=2)
    assert plan.peers == ("torchdata", "spdl") and plan.stoker_auto
    grid = plan.grid()
    by_library: dict[str, list[ContenderSpec]] = {}
    for spec in grid:
        by_library.setdefault(spec.library, []).append(spec)
    budget = len(by_library["torch"])
    assert budget == 17  # nw=0, then 1..8 x prefetch {2, 4}
    assert [s.num_workers for s in by_library["spdl"]] == [1, 2, 4, 8, 16, 32, 64]
    assert [s.name for s in by_library["spdl"]][-1] == "spdl threads=64"
    torchdata = [(s.num_workers, s.prefetch_factor) for s in by_library["torchdata"]]
    assert torchdata == [(nw, pf) for nw in range(1, 9) for pf in (2, 4)]
    assert all(len(specs) <= budget for specs in by_library.values())
    # A peer with more knobs than torch's grid has points is cut to the same budget.
    wide = dataclasses.replace(plan, peer_threads=tuple(range(1, 40)))
    assert sum(s.library == "spdl" for s in wide.grid()) == budget
    assert {s.library for s in dataclasses.replace(plan, peers=()).grid()} == {"torch"}
    quick = make_plan(quick=True, cores=2)
    assert quick.stoker_auto and quick.train_shapes == ("gpu",)


def test_peer_grid_rejects_an_unknown_library() -> None:
    import pytest

    from stoker.bench._plan import peer_grid
    from stoker.errors import ConfigError

    with pytest.raises(ConfigError, match="no grid for library 'dali'"):
        peer_grid("dali", (1,), (2,), (1,))


def test_installed_peers_run_every_batch_once() -> None:
    peers, _notes = installed_peers()
    for library in peers:
        for spec in (ContenderSpec(library, 1, 2), ContenderSpec(library, 3, 4)):
            loader = build_loader(spec, list(range(64)), 16, range(64))
            seen = sorted(int(x) for b in loader for x in b)
            close_loader(loader)
            assert seen == list(range(64)), spec.name


@pytest.mark.parametrize(
    ("spec", "width", "in_flight"),
    [
        (ContenderSpec("torch", 0), 1, 0),
        (ContenderSpec("torch", 3, 4, True), 3, 12),  # its workers' prefetch queues
        (ContenderSpec("stoker", 0), 1, 0),
        (ContenderSpec("stoker", 2), 2, 4),  # the default prefetch_factor, 2
        (ContenderSpec("torchdata", 3, 4), 3, 10),  # 2 mapper tasks a worker, the prefetcher's
        (ContenderSpec("spdl", 64), 64, 67),  # a batch a thread, SPDL's default sink of 3
        (ContenderSpec("spdl", 8, 3), 8, 11),
    ],
    ids=lambda v: v.name if isinstance(v, ContenderSpec) else str(v),
)
def test_a_contender_says_how_many_batches_it_builds_at_once_and_holds(
    spec: ContenderSpec, width: int, in_flight: int
) -> None:
    assert (spec.width, spec.in_flight) == (width, in_flight)


def test_auto_may_hold_more_than_its_start() -> None:
    from stoker.autotune._prefetch import MAX_PREFETCH

    auto = ContenderSpec("stoker", 2, auto=True)
    assert auto.in_flight >= auto.width * MAX_PREFETCH


class _SlowAfterFirst(tud.Dataset[int]):
    """The first batch loads at once; each later sample takes two seconds."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, idx: int) -> int:
        if idx >= 4:
            time.sleep(2.0)
        return idx


def test_closing_spdl_waits_for_the_batches_its_threads_are_building() -> None:
    """SPDL's own stop gives up after about 6 s and leaves its threads loading beside the
    next contender: closed with 8 s of batches still being built, no thread is left."""
    pytest.importorskip("spdl.pipeline")
    before = threading.active_count()
    loader = build_loader(ContenderSpec("spdl", 2), _SlowAfterFirst(), 4, range(64))
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    close_loader(loader)
    del it
    assert threading.active_count() == before


class _SlowFirstBatch(tud.Dataset[int]):
    """Sample 0 takes half a second; the others load at once."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, idx: int) -> int:
        if idx == 0:
            time.sleep(0.5)
        return idx


def test_spdl_delivers_batches_as_they_are_built_as_its_table_note_says() -> None:
    """The note under SPDL's rows (PEER_ORDER_NOTES) is what its pipeline does: a batch held
    up by a slow sample comes after the batches built meanwhile."""
    pytest.importorskip("spdl.pipeline")
    assert "output_order='completion'" in PEER_ORDER_NOTES["spdl"]
    loader = build_loader(ContenderSpec("spdl", 4), _SlowFirstBatch(), 4, range(16))
    try:
        firsts = [int(b[0]) for b in loader]
    finally:
        close_loader(loader)
    assert sorted(firsts) == [0, 4, 8, 12]
    assert firsts[0] != 0 and firsts[-1] == 0
